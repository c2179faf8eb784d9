"""Registering existing apps (docs/JOBS.md, "Bring an existing app") through manage.py and the
API, with the real check (a child process compiling the app and importing its imports), and
starting a job of one with its arguments: bounded, refused naming the field, recorded for the
app's replicas at launch."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from console.models import Job, RegisteredTopology
from console.redis import redis_client
from console.roles import ADMIN, OPERATOR
from console.services.controller import prepare_app_args
from console.services.recovery import audit_output, has_ground_truth
from spark_runtime import keys
from spark_runtime.jobdef import registered_app, registered_path

pytestmark = [pytest.mark.django_db]


def test_manage_py_registers_an_app_and_prints_its_version_last(jobs_dir):
    out = io.StringIO()
    call_command("register_topology", app="apps/window_counts.py", stdout=out)
    assert out.getvalue().splitlines()[-1] == "window_counts@1"
    version = RegisteredTopology.objects.get(name="window_counts")
    assert (version.app, version.module, version.version) == ("apps/window_counts.py", "", 1)
    app = registered_app("window_counts@1", jobs_dir)
    assert app.source == (jobs_dir / "apps" / "window_counts.py").read_text()

    out = io.StringIO()
    call_command("register_topology", app="apps/window_counts.py", stdout=out)
    assert "unchanged" in out.getvalue() and out.getvalue().splitlines()[-1] == "window_counts@1"

    out = io.StringIO()
    path = jobs_dir / "apps" / "window_counts.py"
    path.write_text(path.read_text().replace('"5 seconds"', '"8 seconds"'))
    call_command("register_topology", app="apps/window_counts.py", name="windows", stdout=out)
    assert out.getvalue().splitlines()[-1] == "windows@1"
    assert "8 seconds" in registered_path("windows", 1, jobs_dir).read_text()

    (jobs_dir / "apps" / "typo.py").write_text("import pyspark\nfor x in range(3)\n    pass\n")
    with pytest.raises(CommandError, match=r"apps/typo.py line 2: SyntaxError"):
        call_command("register_topology", app="apps/typo.py")
    with pytest.raises(CommandError, match="give either a module"):
        call_command("register_topology")


def test_the_api_registers_an_app_and_refuses_naming_the_line(api_as, jobs_dir):
    admin = api_as(ADMIN)
    created = admin.post(
        "/api/topologies/", {"app": "apps/spend_totals.py", "name": "spend"}, format="json"
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert (body["ident"], body["app"], body["module"]) == ("spend@1", "apps/spend_totals.py", "")
    again = admin.post(
        "/api/topologies/", {"app": "apps/spend_totals.py", "name": "spend"}, format="json"
    )
    assert again.status_code == 200 and again.json()["version"] == 1

    (jobs_dir / "apps" / "missing_dep.py").write_text(
        "from pyspark.sql import SparkSession\n\nimport no_such_package_anywhere\n"
    )
    refused = admin.post("/api/topologies/", {"app": "apps/missing_dep.py"}, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["detail"]["app"] == [
        "apps/missing_dep.py line 3: ModuleNotFoundError: No module named "
        "'no_such_package_anywhere'"
    ]
    outside = admin.post("/api/topologies/", {"app": "../../etc/passwd.py"}, format="json")
    assert outside.status_code == 400
    assert "outside the jobs directory" in outside.json()["error"]["detail"]["app"][0]
    named = admin.post(
        "/api/topologies/", {"app": "apps/spend_totals.py", "name": "Spend!"}, format="json"
    )
    assert named.status_code == 400 and "name" in named.json()["error"]["detail"]
    both = admin.post(
        "/api/topologies/", {"app": "apps/spend_totals.py", "module": "a.b:c"}, format="json"
    )
    assert both.status_code == 400 and "module" in both.json()["error"]["detail"]
    assert api_as(OPERATOR).post(
        "/api/topologies/", {"app": "apps/spend_totals.py"}, format="json"
    ).status_code == 403  # fmt: skip
    assert list(RegisteredTopology.objects.values_list("name", flat=True)) == ["spend"]


def test_a_job_of_an_app_takes_bounded_args_recorded_for_its_replicas(api_as, jobs_dir):
    api_as(ADMIN).post(
        "/api/topologies/", {"app": "apps/window_counts.py", "name": "windows"}, format="json"
    )
    operator = api_as(OPERATOR)

    def start(**fields):
        request = {"name": "w", "topology": "windows@1", "strategy": "restart-all", **fields}
        return operator.post("/api/jobs/", request, format="json")

    started = start(args=["--in", "/data/in", "--out", "/data/out"])
    assert started.status_code == 201, started.json()
    body = started.json()
    assert body["args"] == ["--in", "/data/in", "--out", "/data/out"]
    assert body["params"]["rate"] == 0  # no generator: an app reads its own input
    assert [(op["name"], op["kind"]) for op in body["operators"]] == [("app", "map")]

    for fields, field, message in [
        ({"args": ["x"] * 65}, "args", "args: at most 64 arguments, got 65"),
        ({"args": ["ok", "y" * 1025]}, "args", "args[1]: at most 1024 characters"),
        ({"args": "--in /data"}, "args", "args: must be a list of strings"),
        ({"params": {"rate": 50}}, "params", "params.rate: an app reads its own input"),
        ({"source": {"kind": "kafka", "topic": "t"}}, "source", "source: an app reads"),
        ({"strategy": "adaptive"}, "strategy", "strategy: an existing app runs as one copy"),
    ]:
        refused = start(**fields)
        assert refused.status_code == 400, fields
        assert refused.json()["error"]["detail"][field][0].startswith(message)
    builtin = operator.post(
        "/api/jobs/", {"name": "b", "topology": "wordcount", "args": ["--x"]}, format="json"
    )
    assert builtin.status_code == 400
    assert builtin.json()["error"]["detail"]["args"] == [
        "args: only a registered app takes arguments"
    ]

    job = Job.objects.get(pk=body["id"])
    # No second copy of it by a strategy change (its upgrades: tests/console/test_app_upgrades.py).
    refused = operator.post(f"/api/jobs/{job.pk}/upgrade/", {"strategy": "adaptive"}, format="json")
    assert refused.status_code == 400, refused.json()
    assert "runs as one copy under restart-all" in refused.json()["error"]["detail"]["strategy"][0]
    redis = redis_client()
    # The app writes where its code says: Backstop holds no results of it and audits none.
    results = operator.get(f"/api/jobs/{job.pk}/results/")
    assert results.status_code == 200 and results.json()["total_keys"] == 0
    assert audit_output(job, redis) is None and not has_ground_truth(job)
    try:
        prepare_app_args(job, redis)
        assert json.loads(redis.get(keys.app_args(job.key))) == job.args
        job.args = []
        prepare_app_args(job, redis)
        assert redis.get(keys.app_args(job.key)) is None
    finally:
        keys.delete_job_keys(redis, job.key)


def test_the_admin_lists_apps_and_still_requires_a_module(client, users, api_as, jobs_dir):
    api_as(ADMIN).post("/api/topologies/", {"app": "apps/window_counts.py"}, format="json")
    admin = users[ADMIN]
    admin.is_staff = True
    admin.save()
    client.force_login(admin)
    listed = client.get("/admin/console/registeredtopology/").content.decode()
    assert "apps/window_counts.py" in listed
    empty = client.post("/admin/console/registeredtopology/add/", {"module": ""})
    assert empty.status_code == 200 and "This field is required." in empty.content.decode()
    assert RegisteredTopology.objects.count() == 1
