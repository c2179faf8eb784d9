"""docker/k8s/ checked offline, without a cluster: every manifest against the Kubernetes OpenAPI
schemas that kubernetes-validate ships (strict: an unknown or misspelt field fails), and wired as
the code expects: settings the code reads and that load, references that resolve, selectors that
match, probes on the console's port, the Celery argv of infra/launcher.py, shared storage where
the settings look for it."""

from __future__ import annotations

import copy
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.urls import resolve
from kubernetes_validate import ValidationError, latest_version, validate

from infra.kafka import KAFKA_VERSION, parse_bootstrap_servers
from infra.launcher import agent_argv, alerts_argv, controller_argv
from infra.queues import ALERTS_QUEUE, CONTROL_QUEUE, node_queue

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "docker" / "k8s"
# The oldest Kubernetes these manifests are meant for, and the newest the package knows.
SCHEMA_VERSIONS = ("1.30", latest_version())
GUNICORN = ["gunicorn", "-c", "web/gunicorn.conf.py", "web.wsgi:application"]
SOURCE_PACKAGES = ("web", "infra", "console", "workers", "spark_runtime")
# How the code reads a variable: env("NAME", ...) (spark_runtime.env), os.environ.get / setdefault /
# [...], os.getenv, and the gunicorn settings' _positive_int("NAME", ...) (web/gunicorn.conf.py).
READS = re.compile(
    r"""(?:\benv|\bgetenv|environ\.get|environ\.setdefault|_positive_int)\(\s*["']([A-Z][A-Z0-9_]*)["']"""
    r"""|environ\[\s*["']([A-Z][A-Z0-9_]*)["']\s*\]"""
)
SECRET_NAMES = {"SECRET_KEY", "DATABASE_URL", "METRICS_TOKEN", "EMAIL_URL"}


@pytest.fixture(autouse=True)
def _clear_cache():
    """Replaces the suite's autouse fixture that empties the Redis cache: nothing here needs
    Redis, a database or the network."""


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def all_resources() -> list[tuple[str, dict]]:
    return [(path.name, doc) for path in manifest_files() for doc in documents(path)]


def the(kind: str, name: str) -> dict:
    found = [r for _, r in all_resources() if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads() -> list[dict]:
    return [r for _, r in all_resources() if r["kind"] in {"Deployment", "DaemonSet", "Job"}]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def container(workload: dict) -> dict:
    (only,) = pod_spec(workload)["containers"]
    return only


def config() -> dict[str, str]:
    return the("ConfigMap", "backstop-config")["data"]


def secret() -> dict[str, str]:
    return the("Secret", "backstop-secrets")["stringData"]


def quantity(value: str | int) -> float:
    """A Kubernetes quantity in cores or bytes ("500m", "2", "512Mi", "8Gi")."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    assert match and match[2] in {"", *units}, f"unexpected quantity {value!r}"
    return float(match[1]) * units.get(match[2], 1)


def port_number(target, container_spec: dict) -> int:
    """A probe's or Service's port, by number or by the name of a container port."""
    if isinstance(target, int):
        return target
    (number,) = [p["containerPort"] for p in container_spec["ports"] if p.get("name") == target]
    return number


def names_read_by_the_code() -> set[str]:
    names = set()
    for package in SOURCE_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for match in READS.finditer(path.read_text()):
                names.add(match[1] or match[2])
    return names


@pytest.fixture(scope="module")
def production_settings(tmp_path_factory) -> dict:
    """web.settings.production loaded in a fresh interpreter with exactly the ConfigMap's and the
    Secret's values (BACKSTOP_VAR_DIR aside: created at import, so a temporary one here)."""
    var_dir = tmp_path_factory.mktemp("var")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        **config(),
        **secret(),
        "BACKSTOP_VAR_DIR": str(var_dir),
    }
    script = (
        "import json\n"
        "from web.settings import production as s\n"
        "print(json.dumps({\n"
        "  'ALLOWED_HOSTS': s.ALLOWED_HOSTS, 'DEBUG': s.DEBUG,\n"
        "  'SECURE_PROXY_SSL_HEADER': s.SECURE_PROXY_SSL_HEADER,\n"
        "  'SECURE_REDIRECT_EXEMPT': s.SECURE_REDIRECT_EXEMPT,\n"
        "  'TRUSTED_PROXIES': s.TRUSTED_PROXIES,\n"
        "  'DATABASE_ENGINE': s.DATABASES['default']['ENGINE'],\n"
        "  'EMAIL_BACKEND': s.EMAIL_BACKEND, 'REDIS_URL': s.REDIS_URL,\n"
        "  'CHECKPOINT_ROOT': str(s.BACKSTOP_CHECKPOINT_ROOT),\n"
        "  'STATIC_UNDER_VAR': str(s.STATIC_ROOT.relative_to(s.VAR_DIR)),\n"
        "}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(version):
    failures = []
    for filename, resource in all_resources():
        try:
            validate(resource, version, strict=True)
        except ValidationError as exc:
            where = ".".join(str(part) for part in exc.path)
            failures.append(f"{filename} {resource['kind']}: {where}: {exc.message}")
    assert not failures, "\n".join(failures)
    kinds = {r["kind"] for _, r in all_resources()}
    expected = {"Namespace", "ConfigMap", "Secret", "PersistentVolumeClaim", "Service"}
    assert kinds >= expected | {"Deployment", "DaemonSet", "Job"}


def test_the_schema_check_refuses_a_broken_manifest():
    web = copy.deepcopy(the("Deployment", "web"))
    container(web)["comand"] = GUNICORN  # misspelt: strict validation knows no such field
    with pytest.raises(ValidationError):
        validate(web, SCHEMA_VERSIONS[0], strict=True)
    config_map = copy.deepcopy(the("ConfigMap", "backstop-config"))
    config_map["data"]["LOG_LEVEL"] = 10  # ConfigMap values are strings
    with pytest.raises(ValidationError):
        validate(config_map, SCHEMA_VERSIONS[0], strict=True)


def test_the_kustomization_lists_every_manifest_in_the_folder():
    kustomization = documents(K8S / "kustomization.yaml")[0]
    assert kustomization["kind"] == "Kustomization"
    listed = kustomization["resources"]
    assert sorted(listed) == [p.name for p in manifest_files()]
    assert len(set(listed)) == len(listed)
    assert listed[0] == "namespace.yaml"  # the namespace before what goes in it
    assert not list(K8S.glob("*.yml")), "name manifests *.yaml"
    for filename, resource in all_resources():
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == "backstop", filename


def test_every_setting_the_manifests_set_is_one_the_code_reads():
    read = names_read_by_the_code()
    assert {"SECRET_KEY", "DATABASE_URL", "BACKSTOP_NODE"} <= read  # the grep finds them
    explicit = {e["name"] for w in workloads() for e in container(w).get("env", [])}
    unread = (set(config()) | set(secret()) | explicit) - read
    assert not unread, f"set in docker/k8s but read nowhere in {SOURCE_PACKAGES}: {unread}"
    assert set(secret()) == SECRET_NAMES
    assert not set(config()) & set(secret())
    for name, value in secret().items():
        assert "change-me" in value, f"{name} must be a placeholder marked change-me"


def test_the_production_settings_load_with_the_configmap_and_the_secret(production_settings):
    loaded = production_settings
    assert loaded["DEBUG"] is False
    assert loaded["DATABASE_ENGINE"] == "django.db.backends.postgresql"
    assert loaded["EMAIL_BACKEND"] == "django.core.mail.backends.smtp.EmailBackend"
    assert loaded["REDIS_URL"] == config()["REDIS_URL"]
    assert loaded["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert loaded["TRUSTED_PROXIES"]
    assert loaded["CHECKPOINT_ROOT"] == config()["BACKSTOP_CHECKPOINT_ROOT"]


def test_every_reference_resolves():
    maps = {
        ("configMapRef", r["metadata"]["name"]): set(r["data"])
        for _, r in all_resources()
        if r["kind"] == "ConfigMap"
    }
    maps |= {
        ("secretRef", r["metadata"]["name"]): set(r["stringData"])
        for _, r in all_resources()
        if r["kind"] == "Secret"
    }
    claims = {
        r["metadata"]["name"] for _, r in all_resources() if r["kind"] == "PersistentVolumeClaim"
    }
    for workload in workloads():
        name = workload["metadata"]["name"]
        spec = pod_spec(workload)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for volume in volumes.values():
            assert volume["persistentVolumeClaim"]["claimName"] in claims, name
        for c in spec["containers"]:
            defined = set()
            for source in c.get("envFrom", []):
                ((kind, ref),) = source.items()
                assert (kind, ref["name"]) in maps, f"{name}: no {kind} {ref['name']}"
                defined |= maps[(kind, ref["name"])]
            for var in c.get("env", []):
                ref = var.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    key = ref["configMapKeyRef"]
                    present = key["key"] in maps[("configMapRef", key["name"])]
                    assert present or key.get("optional"), (name, var["name"])
                if "secretKeyRef" in ref:
                    key = ref["secretKeyRef"]
                    assert key["key"] in maps[("secretRef", key["name"])], (name, var["name"])
                if "resourceFieldRef" in ref:
                    owner = ref["resourceFieldRef"]["containerName"]
                    assert owner in {o["name"] for o in spec["containers"]}, (name, var["name"])
                defined.add(var["name"])
            # The kubelet expands $(NAME) in the command only for variables the container has.
            for word in c.get("command", []) + c.get("args", []):
                for used in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", word):
                    assert used in defined, f"{name}: $({used}) is not in the container's env"
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, (name, mount["name"])
            # Every role of the console reads the same settings; the agents only theirs.
            if workload["kind"] != "DaemonSet":
                assert {k for k, _ in maps} == {k for s in c.get("envFrom", []) for k in s}, name


def test_selectors_match_their_pods_and_the_service_selects_only_the_console():
    for workload in workloads():
        if workload["kind"] == "Job":
            continue  # Kubernetes generates a Job's selector
        labels = workload["spec"]["template"]["metadata"]["labels"]
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), workload["metadata"]["name"]
    service = the("Service", "web")
    web = the("Deployment", "web")
    chosen = service["spec"]["selector"]
    for workload in workloads():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        selected = chosen.items() <= labels.items()
        is_web = (workload["kind"], workload["metadata"]["name"]) == ("Deployment", "web")
        assert selected == is_web, workload["metadata"]["name"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == 8000
    assert port_number(port["targetPort"], container(web)) == 8000


def test_the_console_runs_gunicorn_on_the_probed_port(monkeypatch):
    web = container(the("Deployment", "web"))
    assert web["command"] == GUNICORN
    assert "args" not in web
    monkeypatch.delenv("GUNICORN_BIND", raising=False)
    assert "GUNICORN_BIND" not in config()
    bind = runpy.run_path(str(ROOT / "web" / "gunicorn.conf.py"))["bind"]
    (port,) = web["ports"]
    assert bind.rsplit(":", 1)[1] == str(port["containerPort"]) == "8000"


def test_the_console_is_ready_on_healthz_and_alive_without_its_dependencies(production_settings):
    web = container(the("Deployment", "web"))
    assert resolve("/healthz").func.__name__ == "healthz"
    ready = web["readinessProbe"]["httpGet"]
    assert ready["path"] == "/healthz"
    assert port_number(ready["port"], web) == 8000
    # The kubelet sends the pod's IP as Host unless told otherwise; Django refuses a host not in
    # ALLOWED_HOSTS (400), and the production settings would redirect anything but /healthz.
    headers = {h["name"].lower(): h["value"] for h in ready.get("httpHeaders", [])}
    assert headers.get("host") in production_settings["ALLOWED_HOSTS"]
    assert any(re.search(p, "healthz") for p in production_settings["SECURE_REDIRECT_EXEMPT"])
    # /healthz answers 503 when the database, Redis or every worker is down: a liveness probe on
    # it would restart the console for what a restart cannot fix.
    for probe in ("livenessProbe", "startupProbe"):
        check = web[probe]
        assert check.get("httpGet", {}).get("path") != "/healthz", probe
        (kind,) = {"httpGet", "tcpSocket", "exec", "grpc"} & set(check)
        assert kind != "exec", probe
        assert port_number(check[kind]["port"], web) == 8000, probe


def test_the_controller_beat_and_agents_run_the_launchers_argv():
    controller = the("Deployment", "controller")
    # infra/launcher.py starts `python -m celery ...`; the image has the `celery` script.
    assert container(controller)["command"] == ["celery", *controller_argv()[3:]]
    assert CONTROL_QUEUE in container(controller)["command"]
    agent = the("DaemonSet", "agent")
    command = container(agent)["command"]
    concrete = [word.replace("$(BACKSTOP_NODE)", "node-7") for word in command]
    assert concrete == ["celery", *agent_argv("node-7")[3:]]
    assert node_queue("node-7") in concrete
    alerts = the("Deployment", "alerts")
    assert container(alerts)["command"] == ["celery", *alerts_argv()[3:]]
    assert ALERTS_QUEUE in container(alerts)["command"]
    beat = the("Deployment", "beat")
    assert container(beat)["command"][:4] == ["celery", "-A", "web", "beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"  # never two beats at once
    for workload in (controller, alerts, agent, beat):
        # No `celery inspect ping` exec probes: a restarted agent takes its stages with it.
        assert "livenessProbe" not in container(workload), workload["metadata"]["name"]


def test_one_agent_per_kubernetes_node_allowed_to_raise_its_stages_priority():
    agent = the("DaemonSet", "agent")
    c = container(agent)
    env = {e["name"]: e for e in c["env"]}
    assert env["BACKSTOP_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The node's capacity is this container's limits, not the machine's.
    assert env["BACKSTOP_NODE_SCOPE"]["value"] == "processes"
    capacity = {"BACKSTOP_NODE_CPU": "limits.cpu", "BACKSTOP_NODE_MEM_MB": "limits.memory"}
    for name, resource in capacity.items():
        assert env[name]["valueFrom"]["resourceFieldRef"]["resource"] == resource
    assert env["BACKSTOP_NODE_MEM_MB"]["valueFrom"]["resourceFieldRef"]["divisor"] == "1Mi"
    # nice -5 for primaries needs CAP_SYS_NICE, which reaches the processes of a root user only.
    security = c["securityContext"]
    assert "SYS_NICE" in security["capabilities"]["add"]
    assert security["runAsUser"] == 0
    namespace = the("Namespace", "backstop")["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "privileged"
    assert quantity(c["resources"]["limits"]["memory"]) >= 4 * 2**30  # Spark drivers


def test_the_migrate_job_migrates():
    job = the("Job", "migrate")
    assert container(job)["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert pod_spec(job)["restartPolicy"] in {"OnFailure", "Never"}


def test_every_container_runs_the_image_with_requests_and_limits():
    for workload in workloads():
        for c in pod_spec(workload)["containers"]:
            name = workload["metadata"]["name"]
            assert c["image"] == "backstop:latest", name
            assert c["imagePullPolicy"] == "IfNotPresent", name
            for resource in ("cpu", "memory"):
                request = quantity(c["resources"]["requests"][resource])
                limit = quantity(c["resources"]["limits"][resource])
                assert 0 < request <= limit, (name, resource)


def test_the_roles_share_checkpoints_and_jobs_and_keep_the_images_static_files(
    production_settings,
):
    var_dir = Path(config()["BACKSTOP_VAR_DIR"])
    # The image collected its static files under its own BACKSTOP_VAR_DIR at build time.
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert f"BACKSTOP_VAR_DIR={var_dir}" in dockerfile
    static_root = var_dir / production_settings["STATIC_UNDER_VAR"]
    checkpoints = Path(config()["BACKSTOP_CHECKPOINT_ROOT"])
    jobs = Path(config()["BACKSTOP_JOBS_DIR"])
    for _, claim in all_resources():
        if claim["kind"] == "PersistentVolumeClaim":
            assert claim["spec"]["accessModes"] == ["ReadWriteMany"], claim["metadata"]["name"]
    for role in ("web", "controller", "agent"):
        (workload,) = [w for w in workloads() if w["metadata"]["name"] == role]
        volumes = pod_spec(workload)["volumes"]
        claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in volumes}
        mounts = {
            Path(m["mountPath"]): (claims[m["name"]], m.get("subPath"))
            for m in container(workload)["volumeMounts"]
        }
        assert mounts[jobs] == ("backstop-jobs", None), role
        assert mounts[checkpoints] == ("backstop-var", "checkpoints"), role
        for path in mounts:
            # A volume at or above STATIC_ROOT would hide the image's collected files.
            assert not static_root.is_relative_to(path), (role, path)


def test_the_kafka_node_answers_at_the_address_backstop_is_given():
    kafka = the("StatefulSet", "kafka")
    service = the("Service", "kafka")
    (broker,) = pod_spec(kafka)["containers"]
    assert broker["image"] == f"apache/kafka:{KAFKA_VERSION}"  # the version Backstop starts
    env = {e["name"]: e["value"] for e in broker["env"]}
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, one node
    assert kafka["spec"]["replicas"] == 1
    (voter,) = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert voter.split("@")[0] == env["KAFKA_NODE_ID"]
    for name in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[name] == "1", name
    # Backstop's pods are given the address the broker advertises, which is the Service's.
    bootstrap = config()["KAFKA_BOOTSTRAP_SERVERS"]
    assert parse_bootstrap_servers(bootstrap) == bootstrap
    assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{bootstrap}"
    host, port = bootstrap.rsplit(":", 1)
    assert host in {service["metadata"]["name"], f"{service['metadata']['name']}.backstop.svc"}
    assert kafka["spec"]["serviceName"] == service["metadata"]["name"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["port"] == int(port)
    assert port_number(service_port["targetPort"], broker) == int(port)
    labels = kafka["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert not the("Service", "web")["spec"]["selector"].items() <= labels.items()
    # Its log directory on a volume of its own, writable by the image's user.
    (claim,) = kafka["spec"]["volumeClaimTemplates"]
    mounts = {m["mountPath"]: m["name"] for m in broker["volumeMounts"]}
    assert mounts[env["KAFKA_LOG_DIRS"]] == claim["metadata"]["name"]
    security = pod_spec(kafka)["securityContext"]
    assert security["fsGroup"] == security["runAsUser"] == 1000
    for resource in ("cpu", "memory"):
        request = quantity(broker["resources"]["requests"][resource])
        assert 0 < request <= quantity(broker["resources"]["limits"][resource])


def agent_env() -> dict[str, str | None]:
    """The agent container's variables as the kubelet sets them: ConfigMap keys resolved (None
    for an optional key the ConfigMap lacks), downward-API fields left out."""
    resolved = {}
    for var in container(the("DaemonSet", "agent"))["env"]:
        if "value" in var:
            resolved[var["name"]] = var["value"]
        elif "configMapKeyRef" in var["valueFrom"]:
            resolved[var["name"]] = config().get(var["valueFrom"]["configMapKeyRef"]["key"])
    return resolved


def test_the_agents_get_none_of_the_secrets_and_start_without_them(tmp_path):
    """Issue 58: an agent's stages (its children) run users' job code. The agents take nothing
    of the Secret and only the ConfigMap keys they read, and their settings load, Django's checks
    pass and the agent's tasks import with exactly that environment."""
    agent = container(the("DaemonSet", "agent"))
    assert "envFrom" not in agent
    refs = [var.get("valueFrom", {}) for var in agent["env"]]
    assert not [ref for ref in refs if "secretKeyRef" in ref]
    env = agent_env()
    assert env["DJANGO_SETTINGS_MODULE"] == "web.settings.agent"
    assert not set(env) & SECRET_NAMES
    given = {name: value for name, value in env.items() if value is not None}
    script = (
        "import django, json\n"
        "django.setup()\n"
        "from django.conf import settings\n"
        "from django.core.checks import run_checks\n"
        "import workers.agent, workers.tasks\n"
        "assert not [m for m in run_checks() if m.is_serious()]\n"
        "print(json.dumps({'REDIS_URL': settings.REDIS_URL,\n"
        "  'DATABASE_ENGINE': settings.DATABASES['default']['ENGINE'],\n"
        "  'KEY_LENGTH': len(settings.SECRET_KEY)}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **given,
            "BACKSTOP_VAR_DIR": str(tmp_path),
            "BACKSTOP_NODE": "node-7",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["REDIS_URL"] == config()["REDIS_URL"]
    assert loaded["DATABASE_ENGINE"] == "django.db.backends.dummy"
    assert loaded["KEY_LENGTH"] >= 50
