"""Thresholds: validation naming the field, versions with who/when/why and the diff, revert."""

import pytest
from django.contrib.auth.models import User

from console.models import Policy
from console.roles import ADMIN
from console.services import policy as policy_service
from console.services.policy import PolicyRejected, change_policy, policy_in_force, revert_policy

pytestmark = pytest.mark.django_db


@pytest.fixture
def baseline():
    """v1 with known values, so the expectations do not depend on the model's defaults."""
    policy = Policy(
        priority_threshold=0.3, resource_reserve=0.2, checkpoint_min_s=1.0, reason="baseline"
    )
    policy.save()
    return policy


@pytest.fixture
def staff_admin(users):
    user = users[ADMIN]
    user.is_staff = True
    user.save()
    return user


def policy_form_data(**overrides):
    """Every field of the admin's add form, from the version in force, with `overrides`."""
    current = Policy.current()
    data = {name: getattr(current, name) for name in Policy.threshold_field_names()}
    data["reason"] = "tuning"
    data.update(overrides)
    return data


# Service ------------------------------------------------------------------------------------


def test_each_change_is_a_new_version_with_author_reason_and_diff(baseline, users):
    v2 = change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="fewer standbys")
    v3 = change_policy(
        {"resource_reserve": 0.3, "checkpoint_min_s": 2.0}, user=users[ADMIN], reason="headroom"
    )
    assert (v2.version, v2.created_by.username, v2.reason) == (2, "ada", "fewer standbys")
    assert v2.created_at is not None
    assert baseline.changes_from_previous() == {}
    assert v2.changes_from_previous() == {"priority_threshold": [0.3, 0.5]}
    assert v3.changes_from_previous() == {
        "resource_reserve": [0.2, 0.3],
        "checkpoint_min_s": [1.0, 2.0],
    }
    # The older versions are untouched.
    assert Policy.objects.get(version=1).priority_threshold == 0.3


def test_a_reason_is_required(baseline, users):
    with pytest.raises(PolicyRejected) as info:
        change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="  ")
    assert set(info.value.errors) == {"reason"}
    assert "reason" in info.value.errors["reason"]
    assert Policy.objects.count() == 1


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"priority_threshold": 1.5}, "priority_threshold", "between 0 and 1"),
        ({"w_type": 0.9}, "w_type", "must sum to 1"),
        ({"checkpoint_min_s": 90.0, "checkpoint_max_s": 60.0}, "checkpoint_max_s", "greater"),
        ({"q_samples": 0}, "q_samples", "between 1 and 1000"),
        ({"recovery_band": 1.0}, "recovery_band", "between 0 and 1"),
        ({"nonsense": 1}, "nonsense", "not a policy field"),
    ],
)
def test_invalid_values_are_refused_naming_the_field(baseline, users, changes, field, words):
    with pytest.raises(PolicyRejected) as info:
        change_policy(changes, user=users[ADMIN], reason="try")
    assert field in info.value.errors
    assert info.value.errors[field].startswith(f"{field}: ")
    assert words in info.value.errors[field]
    assert Policy.objects.count() == 1


def test_revert_writes_a_new_version_and_keeps_history(baseline, users):
    change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="fewer standbys")
    v3 = revert_policy(1, user=users[ADMIN])
    assert (v3.version, v3.reason, v3.created_by.username) == (3, "revert to v1", "ada")
    assert v3.priority_threshold == 0.3
    assert v3.changes_from_previous() == {"priority_threshold": [0.5, 0.3]}
    thresholds = Policy.objects.order_by("version").values_list("priority_threshold", flat=True)
    assert list(thresholds) == [0.3, 0.5, 0.3]


def test_policy_in_force_is_reread_each_time(baseline, users):
    """The controller calls policy_in_force() every cycle: a change shows up on the next call."""
    assert policy_in_force().priority_threshold == 0.3
    change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="fewer standbys")
    in_force = policy_in_force()
    assert (in_force.version, in_force.priority_threshold) == (2, 0.5)
    assert in_force.to_config().priority_threshold == 0.5


def test_history_pairs_each_version_with_its_diff(baseline, users):
    change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="a")
    change_policy({"priority_threshold": 0.6}, user=users[ADMIN], reason="b")
    history = policy_service.policy_history(limit=2)
    assert [(p.version, changes) for p, changes in history] == [
        (3, {"priority_threshold": [0.5, 0.6]}),
        (2, {"priority_threshold": [0.3, 0.5]}),
    ]


# API ----------------------------------------------------------------------------------------


def test_api_history_has_changes(api_as, baseline):
    client = api_as(ADMIN)
    response = client.patch(
        "/api/policy/", {"priority_threshold": 0.5, "reason": "fewer standbys"}, format="json"
    )
    assert response.status_code == 201
    history = api_as(ADMIN).get("/api/policy/history/").json()
    assert [(v["version"], v["created_by"], v["reason"], v["changes"]) for v in history] == [
        (2, "ada", "fewer standbys", {"priority_threshold": [0.3, 0.5]}),
        (1, None, "baseline", {}),
    ]


def test_api_change_without_reason_is_refused_naming_reason(api_as, baseline):
    response = api_as(ADMIN).patch("/api/policy/", {"priority_threshold": 0.5}, format="json")
    assert response.status_code == 400
    assert "reason" in response.json()["error"]["detail"]
    assert Policy.objects.count() == 1


def test_api_revert(api_as, baseline):
    client = api_as(ADMIN)
    client.patch("/api/policy/", {"priority_threshold": 0.5, "reason": "x"}, format="json")
    response = client.post("/api/policy/revert/1/")
    assert response.status_code == 201
    body = response.json()
    assert (body["version"], body["reason"], body["priority_threshold"]) == (3, "revert to v1", 0.3)
    assert body["created_by"] == "ada"


def test_api_revert_unknown_version_is_json_404(api_as, baseline):
    response = api_as(ADMIN).post("/api/policy/revert/42/")
    assert response.status_code == 404
    assert response.json()["error"]["status"] == 404
    assert "42" in str(response.json()["error"]["detail"])


# Admin --------------------------------------------------------------------------------------


def test_admin_change_takes_effect_and_shows_in_history(client, staff_admin, baseline):
    client.force_login(staff_admin)
    response = client.post(
        "/admin/console/policy/add/",
        policy_form_data(priority_threshold=0.55, reason="fewer standbys"),
    )
    assert response.status_code == 302
    in_force = policy_in_force()
    assert (in_force.version, in_force.priority_threshold) == (2, 0.55)
    assert (in_force.created_by, in_force.reason) == (staff_admin, "fewer standbys")

    changelist = client.get("/admin/console/policy/").content.decode()
    assert "priority_threshold: 0.3 → 0.55" in changelist
    detail = client.get(f"/admin/console/policy/{in_force.pk}/change/").content.decode()
    assert "<td>priority_threshold</td><td>0.3</td><td>0.55</td>" in detail


def test_admin_add_form_starts_from_the_version_in_force(client, staff_admin, baseline):
    client.force_login(staff_admin)
    form = client.get("/admin/console/policy/add/").context["adminform"].form
    assert form.initial["priority_threshold"] == 0.3


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        ({"priority_threshold": 1.5}, "priority_threshold", "between 0 and 1"),
        ({"w_type": 0.9}, "w_type", "must sum to 1"),
        ({"checkpoint_min_s": 90, "checkpoint_max_s": 60}, "checkpoint_max_s", "greater"),
        ({"reason": ""}, "reason", "required"),
    ],
)
def test_admin_errors_appear_once_on_the_offending_field(
    client, staff_admin, baseline, overrides, field, words
):
    client.force_login(staff_admin)
    response = client.post("/admin/console/policy/add/", policy_form_data(**overrides))
    assert response.status_code == 200  # the form again, with errors
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field]
    assert len(errors[field]) == 1
    assert words in errors[field][0]
    assert Policy.objects.count() == 1


def test_admin_revert_action(client, staff_admin, baseline):
    change_policy({"priority_threshold": 0.5}, user=staff_admin, reason="x")
    client.force_login(staff_admin)
    response = client.post(
        "/admin/console/policy/",
        {"action": "revert_to_version", "_selected_action": [baseline.pk]},
    )
    assert response.status_code == 302
    latest = policy_in_force()
    assert (latest.version, latest.reason, latest.priority_threshold) == (3, "revert to v1", 0.3)


def test_admin_versions_cannot_be_edited_or_deleted(client, staff_admin, baseline):
    client.force_login(staff_admin)
    data = policy_form_data(priority_threshold=0.9)
    client.post(f"/admin/console/policy/{baseline.pk}/change/", data)
    client.post(f"/admin/console/policy/{baseline.pk}/delete/", {"post": "yes"})
    baseline.refresh_from_db()
    assert baseline.priority_threshold == 0.3
    assert Policy.objects.count() == 1


def test_pages_show_the_version_in_force(client, baseline, users):
    change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="x")
    client.force_login(User.objects.get(username="vera"))
    assert "policy v2 in force" in client.get("/").content.decode()
