"""Registering user jobs through the API, the admin and manage.py: the real check (a child
process importing the module and dry-running it on a local Spark session), versions with who and
when, refusals naming the operator, and jobs keeping the version they started with."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from console.models import Job, RegisteredTopology
from console.redis import redis_client
from console.roles import ADMIN, OPERATOR, VIEWER
from spark_runtime import keys
from spark_runtime.jobdef import registered_path

pytestmark = [pytest.mark.django_db, pytest.mark.spark]

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"


@pytest.fixture
def jobs_dir(tmp_path, monkeypatch):
    directory = tmp_path / "jobs"
    shutil.copytree(EXAMPLES, directory / "examples")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    return directory


BROKEN_KIND = """
from spark_runtime.jobdef import JobDefinition, Operator, Upsert

job = JobDefinition(
    name="broken",
    input_fields={"user": "string"},
    operators=(
        Operator("in", "source"),
        Operator("guess", "magic", upstream=("in",), function=lambda df: df),
        Operator("out", "sink", upstream=("gues",)),
    ),
    output=Upsert(key=("user",)),
)
"""

BROKEN_FUNCTION = """
from spark_runtime.jobdef import JobDefinition, Operator, Upsert

def pick(df):
    return df.select("user", "no_such_column")

job = JobDefinition(
    name="broken",
    input_fields={"user": "string"},
    operators=(
        Operator("in", "source"),
        Operator("pick", "map", upstream=("in",), function=pick),
        Operator("out", "sink", upstream=("pick",)),
    ),
    output=Upsert(key=("user",)),
)
"""


def test_register_through_the_api_versions_and_jobs_keep_theirs(api_as, jobs_dir):
    admin = api_as(ADMIN)
    response = admin.post(
        "/api/topologies/", {"module": "examples.clickstream:activity"}, format="json"
    )
    assert response.status_code == 201, response.json()
    first = response.json()
    assert (first["name"], first["version"], first["ident"]) == ("activity", 1, "activity@1")
    assert first["registered_by"] == "ada"
    assert [op["name"] for op in first["shape"]["operators"]] == [
        "clicks",
        "real_pages",
        "per_window",
        "results",
    ]
    assert first["shape"]["output_mode"] == "update"
    assert registered_path("activity", 1, jobs_dir).is_file()
    # The same module again: nothing new.
    again = admin.post(
        "/api/topologies/", {"module": "examples.clickstream:activity"}, format="json"
    )
    assert again.status_code == 200 and again.json()["version"] == 1

    job_v1 = api_as(OPERATOR).post(
        "/api/jobs/", {"name": "a1", "topology": "activity", "params": {"rate": 0}}, format="json"
    )
    assert job_v1.status_code == 201, job_v1.json()
    assert job_v1.json()["topology"] == "activity@1"
    assert [op["kind"] for op in job_v1.json()["operators"]] == [
        "source",
        "filter",
        "window_aggregate",
        "sink",
    ]

    # An edited module is the next version; the running job keeps version 1.
    module = jobs_dir / "examples" / "clickstream.py"
    module.write_text(module.read_text().replace('"30 seconds"', '"60 seconds"'))
    second = admin.post(
        "/api/topologies/", {"module": "examples.clickstream:activity"}, format="json"
    )
    assert second.status_code == 201 and second.json()["version"] == 2
    assert Job.objects.get(pk=job_v1.json()["id"]).topology == "activity@1"
    assert "30 seconds" in registered_path("activity", 1, jobs_dir).read_text()
    assert "60 seconds" in registered_path("activity", 2, jobs_dir).read_text()
    job_v2 = api_as(OPERATOR).post(
        "/api/jobs/", {"name": "a2", "topology": "activity", "params": {"rate": 0}}, format="json"
    )
    assert job_v2.json()["topology"] == "activity@2"

    listed = api_as(VIEWER).get("/api/topologies/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert [(r["name"], r["version"]) for r in rows] == [("activity", 2), ("activity", 1)]


def test_only_admins_register(api_as, jobs_dir):
    for role in (VIEWER, OPERATOR):
        response = api_as(role).post(
            "/api/topologies/", {"module": "examples.clickstream:activity"}, format="json"
        )
        assert response.status_code == 403
    assert not RegisteredTopology.objects.exists()


def test_refusals_name_the_operator(api_as, jobs_dir):
    (jobs_dir / "team").mkdir()
    (jobs_dir / "team" / "kind.py").write_text(BROKEN_KIND)
    (jobs_dir / "team" / "function.py").write_text(BROKEN_FUNCTION)
    admin = api_as(ADMIN)

    response = admin.post("/api/topologies/", {"module": "team.kind:job"}, format="json")
    assert response.status_code == 400
    errors = response.json()["error"]["detail"]["module"]
    assert any(e.startswith("operator 'guess': unknown kind 'magic'") for e in errors)
    assert any(e.startswith("operator 'out': unknown upstream 'gues'") for e in errors)

    response = admin.post("/api/topologies/", {"module": "team.function:job"}, format="json")
    assert response.status_code == 400
    (error,) = response.json()["error"]["detail"]["module"]
    assert error.startswith("operator 'pick':") and "no_such_column" in error

    response = admin.post("/api/topologies/", {"module": "../../etc/passwd:x"}, format="json")
    assert response.status_code == 400
    assert "expected package.module:attribute" in response.json()["error"]["detail"]["module"][0]
    assert not RegisteredTopology.objects.exists()


def test_manage_py_and_the_admin_register_too(client, users, api_as, jobs_dir):
    call_command("register_topology", "examples.clickstream:server_errors")
    version = RegisteredTopology.objects.get(name="server_errors")
    assert version.version == 1 and version.shape["output"] == {"kind": "append", "key": ["id"]}
    # An appending job's results are the newest records of its output stream.
    created = api_as(OPERATOR).post(
        "/api/jobs/",
        {"name": "e", "topology": "server_errors", "params": {"rate": 0}},
        format="json",
    )
    job = Job.objects.get(pk=created.json()["id"])
    redis = redis_client()
    try:
        redis.xadd(keys.output_stream(job.key), {"key": "e1", "user": "u01"})
        body = api_as(VIEWER).get(f"/api/jobs/{job.pk}/results/").json()
    finally:
        keys.delete_job_keys(redis, job.key)
    assert body["total_records"] == 1 and body["records"][0]["key"] == "e1"
    (jobs_dir / "team").mkdir()
    (jobs_dir / "team" / "kind.py").write_text(BROKEN_KIND)
    with pytest.raises(CommandError, match="operator 'guess': unknown kind 'magic'"):
        call_command("register_topology", "team.kind:job")

    admin = users[ADMIN]
    admin.is_staff = True
    admin.save()
    client.force_login(admin)
    page = client.post(
        "/admin/console/registeredtopology/add/", {"module": "team.kind:job"}, follow=True
    )
    assert "operator &#x27;guess&#x27;: unknown kind" in page.content.decode()
    module = jobs_dir / "examples" / "clickstream.py"
    module.write_text(module.read_text() + "\n# a comment is a change\n")
    page = client.post(
        "/admin/console/registeredtopology/add/",
        {"module": "examples.clickstream:server_errors"},
        follow=True,
    )
    assert "is registered as server_errors@2" in page.content.decode()
    assert (
        RegisteredTopology.objects.get(name="server_errors", version=2).registered_by.username
        == "ada"
    )
