"""The REST API: authentication, permissions per role, validation and JSON errors."""

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from rest_framework.test import APIClient

from console.models import FaultInjection, Job, Policy
from console.roles import ADMIN, OPERATOR, VIEWER
from spark_runtime import keys as data_keys
from tests.factories import EpisodeFactory, NodeFactory, ReplicaFactory, make_job

pytestmark = pytest.mark.django_db


def test_token_auth_issues_a_token_that_works(users):
    client = APIClient()
    response = client.post("/api/auth/token/", {"username": "vera", "password": "pw-for-tests"})
    assert response.status_code == 200
    token = response.json()["token"]
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/jobs/").status_code == 200


def test_wrong_password_is_a_json_400(users):
    response = APIClient().post("/api/auth/token/", {"username": "vera", "password": "nope"})
    assert response.status_code == 400
    assert response.json()["error"]["status"] == 400


def test_anonymous_gets_json_401_or_403():
    response = APIClient().get("/api/jobs/")
    assert response.status_code in (401, 403)
    assert response.json()["error"]["status"] == response.status_code


def test_user_without_role_cannot_read(api_as):
    assert api_as(None).get("/api/jobs/").status_code == 403


@pytest.mark.parametrize("role, allowed", [(VIEWER, False), (OPERATOR, True), (ADMIN, True)])
def test_create_job_needs_operator(api_as, role, allowed):
    response = api_as(role).post(
        "/api/jobs/",
        {"name": "wc", "topology": "wordcount", "strategy": "adaptive", "params": {"rate": 50}},
        format="json",
    )
    assert response.status_code == (201 if allowed else 403)
    if allowed:
        body = response.json()
        assert body["status"] == "created"
        assert [op["name"] for op in body["operators"]] == ["source", "split", "count", "sink"]
        assert Job.objects.get(pk=body["id"]).created_by.username in ("otto", "ada")


def test_create_job_rejects_unknown_topology_naming_the_field(api_as):
    response = api_as(OPERATOR).post(
        "/api/jobs/", {"name": "x", "topology": "nope", "strategy": "adaptive"}, format="json"
    )
    assert response.status_code == 400
    assert "topology" in response.json()["error"]["detail"]


def test_create_job_rejects_bad_rate(api_as):
    response = api_as(OPERATOR).post(
        "/api/jobs/",
        {"name": "x", "topology": "wordcount", "params": {"rate": -5}},
        format="json",
    )
    assert response.status_code == 400
    assert "params.rate" in str(response.json()["error"]["detail"])


@pytest.mark.parametrize("role, allowed", [(VIEWER, False), (OPERATOR, True)])
def test_stop_needs_operator_and_is_idempotent(api_as, role, allowed):
    job = make_job(status=Job.Status.RUNNING)
    client = api_as(role)
    first = client.post(f"/api/jobs/{job.pk}/stop/")
    assert first.status_code == (200 if allowed else 403)
    if allowed:
        # No replicas are running, so the job is stopped at once; asking again changes nothing.
        assert first.json()["status"] == "stopped"
        assert client.post(f"/api/jobs/{job.pk}/stop/").json()["status"] == "stopped"


def test_fault_on_a_job_that_is_not_running_is_refused_with_409(api_as):
    job = make_job(status=Job.Status.CREATED)
    response = api_as(OPERATOR).post(
        f"/api/jobs/{job.pk}/faults/",
        {"kind": "kill-driver", "target_operator": "count"},
        format="json",
    )
    assert response.status_code == 409
    assert "only be injected into running jobs" in response.json()["error"]["detail"]
    assert FaultInjection.objects.count() == 0


def test_fault_is_recorded_with_who_asked(api_as):
    job = make_job(status=Job.Status.RUNNING)
    response = api_as(OPERATOR).post(
        f"/api/jobs/{job.pk}/faults/",
        {"kind": "kill-driver", "target_operator": "count"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    fault = FaultInjection.objects.get()
    assert fault.requested_by.username == "otto"
    assert fault.outcome == FaultInjection.Outcome.PENDING
    listed = api_as(VIEWER).get(f"/api/jobs/{job.pk}/faults/").json()["results"]
    assert [f["kind"] for f in listed] == ["kill-driver"]


def test_viewer_cannot_inject(api_as):
    job = make_job(status=Job.Status.RUNNING)
    response = api_as(VIEWER).post(
        f"/api/jobs/{job.pk}/faults/",
        {"kind": "kill-driver", "target_operator": "count"},
        format="json",
    )
    assert response.status_code == 403


def test_fault_validation_names_the_field(api_as):
    job = make_job(status=Job.Status.RUNNING)
    client = api_as(OPERATOR)
    unknown_op = client.post(
        f"/api/jobs/{job.pk}/faults/",
        {"kind": "kill-driver", "target_operator": "nope"},
        format="json",
    )
    assert unknown_op.status_code == 400
    assert "target_operator" in unknown_op.json()["error"]["detail"]
    no_node = client.post(f"/api/jobs/{job.pk}/faults/", {"kind": "kill-node"}, format="json")
    assert no_node.status_code == 400
    assert "target_node" in no_node.json()["error"]["detail"]


@override_settings(FAULT_RATE_LIMIT_PER_MINUTE=2)
def test_fault_rate_limit(api_as):
    job = make_job(status=Job.Status.RUNNING)
    node = NodeFactory(name="node-1")
    client = api_as(OPERATOR)
    statuses = [
        client.post(
            f"/api/jobs/{job.pk}/faults/",
            {"kind": "pause-node", "target_node": node.name, "params": {"duration_s": 5}},
            format="json",
        ).status_code
        for _ in range(3)
    ]
    assert statuses == [201, 201, 429]


def test_recoveries_and_results_are_readable(api_as):
    job = make_job(status=Job.Status.RUNNING)
    client = api_as(VIEWER)
    assert client.get(f"/api/jobs/{job.pk}/recoveries/").json()["results"] == []
    results = client.get(f"/api/jobs/{job.pk}/results/").json()
    assert results["key"] == data_keys.results(job.key)


def test_a_recovery_says_where_its_time_went(api_as):
    job = make_job(status=Job.Status.RUNNING)
    marks = {"fault": 100.0, "detected": 101.5, "decided": 101.5, "commanded": 102.0,
             "caught_up": 103.0, "first_output": 105.5, "replica": "count-3"}  # fmt: skip
    EpisodeFactory(job=job, action="promote", phases=marks)
    (row,) = api_as(VIEWER).get(f"/api/jobs/{job.pk}/recoveries/").json()["results"]
    assert row["phases"] == {
        "detection": 1.5, "decision": 0.0, "command": 0.5, "process start": None,
        "state restore": None, "catch-up": 1.0, "first output": 2.5,
    }  # fmt: skip
    assert row["phase_marks"] == marks


def test_nodes_are_listed(api_as):
    NodeFactory(name="node-7")
    names = [n["name"] for n in api_as(VIEWER).get("/api/nodes/").json()["results"]]
    assert names == ["node-7"]


@pytest.mark.parametrize("role, allowed", [(VIEWER, False), (OPERATOR, False), (ADMIN, True)])
def test_policy_change_needs_admin(api_as, role, allowed):
    response = api_as(role).patch(
        "/api/policy/", {"priority_threshold": 0.5, "reason": "fewer standbys"}, format="json"
    )
    assert response.status_code == (201 if allowed else 403)
    if allowed:
        current = Policy.current()
        assert (current.version, current.priority_threshold) == (2, 0.5)
        assert current.created_by.username == "ada"
        assert current.reason == "fewer standbys"


def test_invalid_policy_is_refused_naming_the_field_and_nothing_is_written(api_as):
    before = Policy.current().version
    response = api_as(ADMIN).patch(
        "/api/policy/", {"checkpoint_min_s": 90, "checkpoint_max_s": 60}, format="json"
    )
    assert response.status_code == 400
    assert "checkpoint_min_s" in str(response.json()["error"]["detail"])
    assert Policy.objects.order_by("-version").first().version == before


def test_policy_history_lists_versions(api_as):
    client = api_as(ADMIN)
    client.patch("/api/policy/", {"resource_reserve": 0.3, "reason": "more reserve"}, format="json")
    history = client.get("/api/policy/history/").json()
    assert [v["version"] for v in history] == [2, 1]
    assert [v["resource_reserve"] for v in history] == [0.3, 0.2]


def test_unknown_api_path_is_json_404(api_as):
    response = api_as(VIEWER).get("/api/nope/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_unknown_job_is_json_404(api_as):
    response = api_as(VIEWER).get("/api/jobs/999999/")
    assert response.status_code == 404
    assert response.json()["error"]["status"] == 404


def test_server_error_on_api_is_json_500(api_as, monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("console.api.views.read_results", explode)
    job = make_job()
    client = api_as(VIEWER)
    client.raise_request_exception = False
    response = client.get(f"/api/jobs/{job.pk}/results/")
    assert response.status_code == 500
    assert response.json() == {
        "error": {"status": 500, "code": "server_error", "detail": "internal server error"}
    }


def test_session_auth_works_for_logged_in_users(users):
    client = APIClient()
    assert client.login(username="vera", password="pw-for-tests")
    assert client.get("/api/nodes/").status_code == 200
    assert User.objects.filter(username="vera").exists()


@pytest.mark.django_db
def test_a_jobs_replicas_show_their_interval_and_why_a_standby_sits_where_it_is(api_as):
    job = make_job(status=Job.Status.RUNNING, strategy="adaptive")
    verdict = {"operator": "count", "node": "api-node-2", "rule": "kept", "reason": "best Q",
               "reserve": "kept after the cycle", "at": "2026-11-23T16:00:00+00:00"}  # fmt: skip
    ReplicaFactory(job=job, node=NodeFactory(name="api-node-1"), replica_id=f"{job.key}/count-1")
    ReplicaFactory(
        job=job,
        node=NodeFactory(name="api-node-2"),
        replica_id=f"{job.key}/count-2",
        role="standby",
        checkpoint_interval_s=30.0,
        placement=verdict,
        nice=5,
        batch_every_s=3.0,
    )
    response = api_as(VIEWER).get(f"/api/jobs/{job.pk}/")
    assert response.status_code == 200
    by_id = {r["replica_id"]: r for r in response.json()["replicas"]}
    standby = by_id[f"{job.key}/count-2"]
    assert standby["placement"] == verdict
    assert standby["checkpoint_interval_s"] == 30.0
    assert (standby["nice"], standby["batch_every_s"]) == (5, 3.0)
    assert by_id[f"{job.key}/count-1"]["placement"] == {}
