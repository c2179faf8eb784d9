"""Fault params through the API, the console control and `manage.py inject_fault`: typed,
bounded by the target node, refused with a JSON 400 (or CommandError) naming the field."""

import json

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings

from console.dash import controls
from console.models import FaultInjection, Job
from console.roles import OPERATOR
from infra import keys
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    return make_job(status=Job.Status.RUNNING)


@pytest.fixture
def node():
    """node-1 registered with 4 cores and no live sample in Redis."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(keys.node_heartbeat("node-1"))
    yield NodeFactory(name="node-1", cpu_total=4.0)
    client.delete(keys.node_heartbeat("node-1"))


def _post(api_as, job, body):
    return api_as(OPERATOR).post(f"/api/jobs/{job.pk}/faults/", body, format="json")


def _stress(params):
    return {"kind": "stress-node", "target_node": "node-1", "params": params}


BAD_PARAMS = [
    (
        _stress({"duration_s": 600, "workers": 100000}),
        "params.workers: must be between 1 and 4 (the target node's cores), got 100000",
    ),
    (_stress({"duration_s": 10, "workers": "lots"}), "params.workers: must be a whole number"),
    (_stress({"duration_s": 10, "workers": True}), "params.workers: must be a whole number"),
    (_stress({"duration_s": 10, "workers": 1.5}), "params.workers: must be a whole number"),
    (_stress({"duration_s": True}), "params.duration_s: must be a number of seconds"),
    (_stress({"duration_s": 601}), "params.duration_s: must be more than 0 and at most 600"),
    (_stress({"duration_s": 0}), "params.duration_s: must be more than 0 and at most 600"),
    (_stress({"blob": "x" * 1_000_000}), "params: must be at most 1024 bytes of JSON"),
    (_stress({"colour": "red"}), "params.colour: not a parameter of stress-node"),
    (_stress("abc"), "params: must be a JSON object, got str"),
    (_stress([1]), "params: must be a JSON object, got list"),
    (
        {"kind": "kill-driver", "target_operator": "count", "params": {"duration_s": 5}},
        "params.duration_s: not a parameter of kill-driver (accepted: none)",
    ),
    (
        {"kind": "pause-node", "target_node": "node-1", "params": {"workers": 2}},
        "params.workers: not a parameter of pause-node (accepted: duration_s)",
    ),
]


@pytest.mark.parametrize("body, message", BAD_PARAMS)
def test_the_api_refuses_bad_params_with_a_400_naming_the_field(api_as, job, node, body, message):
    response = _post(api_as, job, body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["status"] == 400
    assert list(error["detail"]) == ["params"]
    assert error["detail"]["params"][0].startswith(message)
    assert FaultInjection.objects.count() == 0


def test_params_within_the_bounds_are_stored_with_their_defaults(api_as, job, node):
    response = _post(api_as, job, _stress({"duration_s": 30, "workers": 4}))
    assert response.status_code == 201, response.json()
    assert response.json()["params"] == {"duration_s": 30.0, "workers": 4}
    pause = _post(api_as, job, {"kind": "pause-node", "target_node": "node-1"})
    assert pause.status_code == 201
    assert pause.json()["params"] == {"duration_s": 10.0}


def test_the_node_cores_come_from_its_latest_sample(api_as, job, node):
    """An agent reporting 2 cores bounds the hogs at 2, whatever the registration says."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.set(keys.node_heartbeat("node-1"), json.dumps({"cpu_total": 2.0}), ex=30)
    response = _post(api_as, job, _stress({"duration_s": 10, "workers": 3}))
    assert response.status_code == 400
    assert "between 1 and 2" in response.json()["error"]["detail"]["params"][0]
    assert _post(api_as, job, _stress({"duration_s": 10, "workers": 2})).status_code == 201


@override_settings(FAULT_MAX_DURATION_S=20)
def test_the_longest_duration_comes_from_settings(api_as, job, node):
    response = _post(api_as, job, {"kind": "pause-node", "target_node": "node-1",
                                   "params": {"duration_s": 21}})  # fmt: skip
    assert response.status_code == 400
    assert "at most 20 seconds" in response.json()["error"]["detail"]["params"][0]


def test_the_console_control_refuses_the_same_params(job, node, users):
    def inject(**params):
        return controls.inject_fault(
            users[OPERATOR],
            job.pk,
            kind="stress-node",
            operator=None,
            node_id=node.pk,
            **{"duration_s": None, "workers": None, **params},
        )

    with pytest.raises(controls.ActionRefused, match="params.workers: must be between 1 and 4"):
        inject(duration_s=10, workers=100000)
    with pytest.raises(controls.ActionRefused, match="params.workers: must be a whole number"):
        inject(duration_s=10, workers="lots")
    with pytest.raises(controls.ActionRefused, match="params.duration_s: must be a number"):
        inject(duration_s="abc")
    with pytest.raises(controls.ActionRefused, match="target_node: not a node id"):
        controls.inject_fault(
            users[OPERATOR], job.pk, kind="stress-node", operator=None, node_id=[1], duration_s=5
        )
    assert FaultInjection.objects.count() == 0
    fault = inject(duration_s=10, workers=2)
    assert fault.params == {"duration_s": 10.0, "workers": 2}


def test_manage_inject_fault_refuses_the_same_params(job, node, users):
    def run(*extra):
        call_command("inject_fault", str(job.pk), "stress-node", "--node", "node-1",
                     "--as", "otto", *extra)  # fmt: skip

    with pytest.raises(CommandError, match=r"params.workers: must be between 1 and 4 \(the"):
        run("--duration", "10", "--workers", "100000")
    with pytest.raises(CommandError, match="params.workers: must be a whole number"):
        run("--params", '{"workers": "lots"}')
    with pytest.raises(CommandError, match="params: must be a JSON object, got str"):
        run("--params", '"abc"')
    with pytest.raises(CommandError, match="params: must be a JSON object, got list"):
        run("--params", "[1]")
    with pytest.raises(CommandError, match="params.colour: not a parameter of stress-node"):
        run("--params", '{"colour": "red"}')
    with pytest.raises(CommandError, match="params: --params is not JSON"):
        run("--params", "{")
    assert FaultInjection.objects.count() == 0
