"""Hand-made requests to the Dash update endpoint with values no control would send: each is
refused with a message in the result slot (200), never a 500."""

import json

import pytest

from console.models import FaultInjection, Policy
from console.roles import ADMIN, OPERATOR
from tests.dash.seed import seed_console

pytestmark = pytest.mark.django_db

JOB_UPDATE = "/django_plotly_dash/app/backstop-job/_dash-update-component"
PLACEMENT_UPDATE = "/django_plotly_dash/app/backstop-placement/_dash-update-component"


@pytest.fixture
def seeded():
    return seed_console(minutes=1)


def _fault_body(path, **values):
    state = {"fault-kind": "stress-node", "fault-operator": None, "fault-node": None,
             "fault-duration": 10, "url": path, "fault-workers": None, **values}  # fmt: skip
    order = ["fault-kind", "fault-operator", "fault-node", "fault-duration", "url", "fault-workers"]
    return {
        "output": "fault-result.children",
        "outputs": {"id": "fault-result", "property": "children"},
        "inputs": [{"id": "fault-confirm", "property": "submit_n_clicks", "value": 1}],
        "state": [
            {"id": key, "property": "pathname" if key == "url" else "value", "value": state[key]}
            for key in order
        ],
        "changedPropIds": ["fault-confirm.submit_n_clicks"],
    }


@pytest.mark.parametrize(
    "values, words",
    [
        ({"fault-workers": 100000}, "params.workers: must be between 1 and"),
        ({"fault-workers": "lots"}, "params.workers: must be a whole number"),
        ({"fault-workers": True}, "params.workers: must be a whole number"),
        ({"fault-duration": [1]}, "params.duration_s: must be a number of seconds"),
        ({"fault-node": {"id": 1}}, "target_node: not a node id"),
        ({"fault-kind": ["stress-node"]}, "kind, target_operator: choose them"),
        ({"url": 5}, "no such job"),
    ],
)
def test_forged_fault_inputs_are_refused(client, seeded, users, values, words):
    client.force_login(users[OPERATOR])
    node = seeded.nodes[0]
    body = _fault_body(f"/console/jobs/{seeded.adaptive.pk}/", **{"fault-node": node.pk, **values})
    response = client.post(JOB_UPDATE, json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    assert "Not injected" in response.content.decode()
    assert words in response.content.decode()
    assert not FaultInjection.objects.filter(kind="stress-node").exists()


@pytest.mark.parametrize(
    "field, value, reason, words",
    [
        ("cycle_interval_s", 1e-300, "faster", "cycle_interval_s: must be between 0.5 and 60"),
        ("priority_threshold", True, "x", "priority_threshold: must be a number, not a boolean"),
        (["priority_threshold"], 0.5, "x", "unknown policy field"),
        ("priority_threshold", 0.5, ["x"], "reason: must be text"),
    ],
)
def test_forged_threshold_inputs_are_refused(client, seeded, users, field, value, reason, words):
    client.force_login(users[ADMIN])
    version = Policy.current().version
    body = {
        "output": "threshold-result.children",
        "outputs": {"id": "threshold-result", "property": "children"},
        "inputs": [{"id": "threshold-confirm", "property": "submit_n_clicks", "value": 1}],
        "state": [
            {"id": "threshold-field", "property": "value", "value": field},
            {"id": "threshold-value", "property": "value", "value": value},
            {"id": "threshold-reason", "property": "value", "value": reason},
        ],
        "changedPropIds": ["threshold-confirm.submit_n_clicks"],
    }
    response = client.post(PLACEMENT_UPDATE, json.dumps(body), content_type="application/json")
    assert response.status_code == 200
    assert "Not saved" in response.content.decode()
    assert words in response.content.decode()
    assert Policy.current().version == version
