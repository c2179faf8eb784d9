"""Policy fields keep the controller working: bounds, no booleans, no unknown fields, and PUT
as a full replacement, in the API, the admin form and the console's threshold control."""

import pytest

from console.dash import controls
from console.models import Policy
from console.policy.config import BOUNDS, PolicyConfig
from console.roles import ADMIN

pytestmark = pytest.mark.django_db


@pytest.fixture
def baseline():
    policy = Policy(reason="baseline")
    policy.save()
    return policy


def _detail(response) -> dict:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["status"] == 400
    return error["detail"]


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"cycle_interval_s": 1e-300}, "cycle_interval_s", "must be between 0.5 and 60"),
        ({"heartbeat_timeout_s": 1e-9}, "heartbeat_timeout_s", "must be between 1 and 300"),
        ({"q_decay_lambda": 1e308}, "q_decay_lambda", "must be between 0 and 10"),
        ({"priority_threshold": True}, "priority_threshold", "must be a number, not a boolean"),
        ({"q_samples": False}, "q_samples", "must be a number, not a boolean"),
        ({"foo": 1}, "foo", "foo: unknown policy field"),
        ({"recovery_cost_s": 0}, "recovery_cost_s", "must be between 0.1 and 3600"),
        ({"checkpoint_min_s": 0.01}, "checkpoint_min_s", "must be between 0.1 and 600"),
        (
            {"same_cause_failures_limit": 0},
            "same_cause_failures_limit",
            "same_cause_failures_limit: must be between 1 and 1000",
        ),
        ({"same_cause_failures_limit": 2.5}, "same_cause_failures_limit", "integer"),
    ],
)
def test_patch_refuses_values_that_break_the_controller(api_as, baseline, body, field, words):
    response = api_as(ADMIN).patch("/api/policy/", {**body, "reason": "try"}, format="json")
    detail = _detail(response)
    assert field in detail
    assert words in detail[field][0]
    assert Policy.objects.count() == 1


def test_a_number_too_large_for_a_float_is_refused(api_as, baseline):
    body = '{"q_decay_lambda": 1e400, "reason": "try"}'  # json.loads reads it as inf
    response = api_as(ADMIN).patch("/api/policy/", body, content_type="application/json")
    detail = _detail(response)
    assert list(detail) == ["q_decay_lambda"]
    assert Policy.objects.count() == 1


def test_patch_without_any_field_writes_nothing(api_as, baseline):
    detail = _detail(api_as(ADMIN).patch("/api/policy/", {"reason": "nothing"}, format="json"))
    assert detail == {"non_field_errors": ["give at least one policy field to change"]}
    detail = _detail(api_as(ADMIN).patch("/api/policy/", [1, 2], format="json"))
    assert detail == {"non_field_errors": ["expected a JSON object, got list"]}
    assert Policy.objects.count() == 1


def test_put_is_a_full_replacement(api_as, baseline):
    client = api_as(ADMIN)
    partial = client.put("/api/policy/", {"priority_threshold": 0.5, "reason": "x"}, format="json")
    detail = _detail(partial)
    assert "priority_threshold" not in detail
    assert detail["cycle_interval_s"] == [
        "cycle_interval_s: required (PUT replaces the whole policy; PATCH changes some fields)"
    ]
    assert set(detail) == set(Policy.threshold_field_names()) - {"priority_threshold"}
    # A GET body, edited and sent back, replaces the policy (read-only keys are ignored).
    body = client.get("/api/policy/").json()
    body.update(priority_threshold=0.5, reason="fewer standbys")
    response = client.put("/api/policy/", body, format="json")
    assert response.status_code == 201, response.content
    assert Policy.current().priority_threshold == 0.5
    assert Policy.current().changes_from_previous() == {"priority_threshold": [0.4, 0.5]}


def test_every_field_has_a_bound_and_the_defaults_are_within_them():
    assert set(BOUNDS) == set(PolicyConfig.__dataclass_fields__)
    defaults = PolicyConfig()
    for name, bound in BOUNDS.items():
        assert bound.contains(getattr(defaults, name)), name
        assert bound.why


def test_the_admin_form_refuses_out_of_bound_values(client, users, baseline):
    admin_user = users[ADMIN]
    admin_user.is_staff = True
    admin_user.save()
    client.force_login(admin_user)
    data = {name: getattr(baseline, name) for name in Policy.threshold_field_names()}
    data.update(cycle_interval_s="1e-300", reason="faster")
    response = client.post("/admin/console/policy/add/", data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["cycle_interval_s"]
    assert "must be between 0.5 and 60" in errors["cycle_interval_s"][0]
    assert Policy.objects.count() == 1


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("cycle_interval_s", 1e-300, "cycle_interval_s: must be between 0.5 and 60"),
        ("priority_threshold", True, "priority_threshold: must be a number, not a boolean"),
        ("foo", 1, "foo: unknown policy field"),
        (["cycle_interval_s"], 1, "unknown policy field"),
        ("q_decay_lambda", "abc", "q_decay_lambda: must be a finite number"),
    ],
)
def test_the_console_threshold_control_refuses_the_same(users, baseline, field, value, words):
    with pytest.raises(controls.ActionRefused, match=words.replace("(", r"\(")):
        controls.change_threshold(users[ADMIN], field=field, value=value, reason="try")
    assert Policy.objects.count() == 1


def test_the_admin_form_shows_each_range(client, users, baseline):
    admin_user = users[ADMIN]
    admin_user.is_staff = True
    admin_user.save()
    client.force_login(admin_user)
    page = client.get("/admin/console/policy/add/").content.decode()
    assert 'name="cycle_interval_s"' in page
    assert 'min="0.5"' in page and 'max="60.0"' in page
    assert "Range [0.5, 60]:" in page


def test_the_policy_model_is_policy_config_field_for_field():
    """No second hand-written copy: a fresh Policy is PolicyConfig's defaults, with its types."""
    from django.db import models

    assert Policy().to_config() == PolicyConfig()
    for name in Policy.threshold_field_names():
        field = Policy._meta.get_field(name)
        wanted = int if PolicyConfig.__dataclass_fields__[name].type == "int" else float
        assert isinstance(
            field, models.PositiveIntegerField if wanted is int else models.FloatField
        )
        assert field.help_text == BOUNDS[name].why
