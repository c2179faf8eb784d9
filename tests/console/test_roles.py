"""Roles everywhere: API, admin (staff of every role), management-command and callback helpers."""

import pytest
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError
from django.test import RequestFactory

from console.models import Policy, ReportSubscription
from console.roles import ADMIN, OPERATOR, VIEWER
from console.services.authz import RoleRequired, check_role, require_role, role_required
from tests.factories import ReportSubscriptionFactory, UserFactory

pytestmark = pytest.mark.django_db

ROLES = [VIEWER, OPERATOR, ADMIN]


@pytest.fixture
def staff(users):
    """`staff(role)`: that role's user, made staff so it can open the Django admin."""

    def _staff(role):
        user = users[role]
        user.is_staff = True
        user.save()
        return user

    return _staff


def policy_form_data():
    current = Policy.current()
    data = {name: getattr(current, name) for name in Policy.threshold_field_names()}
    data["reason"] = "tuning"
    return data


def offered_actions(response) -> list[str]:
    """The admin actions in a change list's drop-down (no form at all when none is allowed)."""
    form = response.context["action_form"]
    return [] if form is None else [name for name, _ in form.fields["action"].choices]


# API ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("role, status", [(None, 403), (VIEWER, 200), (OPERATOR, 200)])
def test_policy_history_needs_viewer(api_as, role, status):
    assert api_as(role).get("/api/policy/history/").status_code == status


@pytest.mark.parametrize("role, status", [(VIEWER, 403), (OPERATOR, 403), (ADMIN, 201)])
def test_policy_revert_needs_admin(api_as, role, status):
    Policy.current()
    response = api_as(role).post("/api/policy/revert/1/")
    assert response.status_code == status
    assert Policy.objects.count() == (2 if status == 201 else 1)


def test_anonymous_cannot_revert():
    from rest_framework.test import APIClient

    Policy.current()
    assert APIClient().post("/api/policy/revert/1/").status_code in (401, 403)


# Admin --------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ROLES)
def test_every_staff_role_can_read_the_policy_history(client, staff, role):
    policy = Policy.current()
    client.force_login(staff(role))
    assert client.get("/admin/console/policy/").status_code == 200
    assert client.get(f"/admin/console/policy/{policy.pk}/change/").status_code == 200


@pytest.mark.parametrize("role, can_add", [(VIEWER, False), (OPERATOR, False), (ADMIN, True)])
def test_only_admins_add_policy_versions_in_the_admin(client, staff, role, can_add):
    client.force_login(staff(role))
    assert client.get("/admin/console/policy/add/").status_code == (200 if can_add else 403)
    response = client.post("/admin/console/policy/add/", policy_form_data())
    assert response.status_code == (302 if can_add else 403)
    assert Policy.objects.count() == (2 if can_add else 1)


def test_django_model_permission_does_not_make_an_operator_a_policy_admin(client, staff):
    operator = staff(OPERATOR)
    operator.user_permissions.add(
        Permission.objects.get(codename="add_policy"),
        Permission.objects.get(codename="change_policy"),
    )
    client.force_login(operator)
    assert client.post("/admin/console/policy/add/", policy_form_data()).status_code == 403
    assert Policy.objects.count() == 1


@pytest.mark.parametrize("role, can_revert", [(VIEWER, False), (OPERATOR, False), (ADMIN, True)])
def test_revert_action_is_offered_to_admins_only(client, staff, role, can_revert):
    Policy.current()
    client.force_login(staff(role))
    response = client.get("/admin/console/policy/")
    actions = offered_actions(response)
    assert ("revert_to_version" in actions) is can_revert


def test_revert_action_posted_by_an_operator_does_nothing(client, staff):
    policy = Policy.current()
    client.force_login(staff(OPERATOR))
    client.post(
        "/admin/console/policy/",
        {"action": "revert_to_version", "_selected_action": [policy.pk]},
    )
    assert Policy.objects.count() == 1


@pytest.mark.parametrize(
    "role, can_change, can_send",
    [(VIEWER, False, False), (OPERATOR, False, True), (ADMIN, True, True)],
)
def test_report_subscription_admin_per_role(client, staff, role, can_change, can_send):
    subscription = ReportSubscriptionFactory(name="daily")
    client.force_login(staff(role))
    response = client.get("/admin/console/reportsubscription/")
    assert response.status_code == 200
    actions = offered_actions(response)
    assert ("send_now" in actions) is can_send
    add = client.get("/admin/console/reportsubscription/add/")
    assert add.status_code == (200 if can_change else 403)
    client.post(
        f"/admin/console/reportsubscription/{subscription.pk}/change/",
        {"name": "renamed", "recipients": "x@example.org", "scope": "all", "period_hours": 24},
    )
    subscription.refresh_from_db()
    assert (subscription.name == "renamed") is can_change


def test_admin_creates_a_subscription_with_its_schedule(client, staff):
    client.force_login(staff(ADMIN))
    response = client.post(
        "/admin/console/reportsubscription/add/",
        {
            "name": "weekly",
            "enabled": "on",
            "recipients": "ops@example.org",
            "scope": "all",
            "period_hours": 168,
            "alert_recovery_over_s": "30",
        },
    )
    assert response.status_code == 302
    subscription = ReportSubscription.objects.get(name="weekly")
    assert subscription.periodic_task.task == "backstop.send_report"
    assert subscription.alert_recovery_over_s == 30.0


def test_selected_scope_needs_jobs(client, staff):
    client.force_login(staff(ADMIN))
    response = client.post(
        "/admin/console/reportsubscription/add/",
        {"name": "some", "recipients": "ops@example.org", "scope": "selected", "period_hours": 24},
    )
    assert response.status_code == 200
    assert "jobs" in response.context["adminform"].form.errors


def test_users_without_a_role_see_no_console_models_in_the_admin(client, users):
    nobody = users[None]
    nobody.is_staff = True
    nobody.save()
    client.force_login(nobody)
    assert client.get("/admin/console/policy/").status_code == 403


# require_role / check_role -----------------------------------------------------------------


def test_require_role_returns_the_user_by_name(users):
    assert require_role("ada", ADMIN) == users[ADMIN]
    assert require_role(users[OPERATOR], VIEWER) == users[OPERATOR]


def test_require_role_explains_a_refusal(users):
    with pytest.raises(RoleRequired) as info:
        require_role("otto", ADMIN)
    assert str(info.value) == "user 'otto' has operator; this needs the admin role or higher"
    # One exception that commands and views both understand.
    assert isinstance(info.value, CommandError)
    assert isinstance(info.value, PermissionDenied)


def test_require_role_unknown_and_inactive_users(users):
    with pytest.raises(RoleRequired, match="no user named 'ghost'"):
        require_role("ghost", VIEWER)
    inactive = UserFactory(username="gone", role=ADMIN)
    inactive.is_active = False
    inactive.save()
    with pytest.raises(RoleRequired, match="inactive"):
        require_role("gone", VIEWER)


def test_require_role_rejects_unknown_roles(users):
    with pytest.raises(ValueError, match="unknown role 'root'"):
        require_role("ada", "root")


def test_check_role_for_anonymous():
    from django.contrib.auth.models import AnonymousUser

    with pytest.raises(RoleRequired, match="log in first"):
        check_role(AnonymousUser(), VIEWER)


def test_role_required_decorator_for_dash_callbacks(users):
    @role_required(OPERATOR)
    def stop_job(n_clicks, **kwargs):
        return f"stopped after {n_clicks}"

    assert stop_job(1, user=users[OPERATOR]) == "stopped after 1"
    request = RequestFactory().post("/")
    request.user = users[ADMIN]
    assert stop_job(2, request=request) == "stopped after 2"
    with pytest.raises(RoleRequired):
        stop_job(3, user=users[VIEWER])
    with pytest.raises(RoleRequired):
        stop_job(4)
