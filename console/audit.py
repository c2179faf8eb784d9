"""The audit log's receivers for what no service function of ours writes: sign-ins, API tokens,
group memberships (roles and teams), the admin's user edits and report subscriptions.

Each event goes to the database (console.services.audit_log.record, with who and from where)
and sign-ins also keep their line on the `backstop.audit` logger, e.g.
`login-failed username='ada' address=203.0.113.9`; a single sign-on adds `method=oidc` (and
why, when refused), in the line and in the event's detail. The address is REMOTE_ADDR, which
console.middleware.TrustedProxyMiddleware has already set to the real client behind a trusted
proxy.
"""

import logging

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.models import Group, User
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver
from rest_framework.authtoken.models import Token

from console.auth_throttle import client_address
from console.models import ReportSubscription
from console.models.teams import TEAM_GROUP_PREFIX
from console.oidc import OIDC_BACKEND
from console.roles import ROLE_ORDER
from console.services.audit_log import record

audit_log = logging.getLogger("backstop.audit")

ADMIN_FLAGS = {ADDITION: "add", CHANGE: "change", DELETION: "delete"}


@receiver(user_logged_in, dispatch_uid="backstop.audit_login")
def audit_login(sender, request, user, **kwargs):
    """A successful login (login page, admin, single sign-on); single sign-on says so."""
    # login() records the backend in the session before it sends the signal.
    session = getattr(request, "session", None)
    signed_in_by = session.get(BACKEND_SESSION_KEY) if session is not None else None
    oidc = signed_in_by == OIDC_BACKEND
    audit_log.info(
        "login username=%r address=%s%s",
        user.get_username(),
        client_address(request),
        " method=oidc" if oidc else "",
    )
    record(
        "login",
        request=request,
        actor=user,
        target=f"user:{user.get_username()}",
        detail={"method": "oidc"} if oidc else None,
    )


@receiver(user_login_failed, dispatch_uid="backstop.audit_login_failed")
def audit_login_failed(sender, credentials, request=None, **kwargs):
    """A failed login (wrong password, unknown user, refused while locked out, or a refused
    single sign-on, which says so and why)."""
    username = credentials.get("username")
    username = username if isinstance(username, str) else None
    detail, method = {}, ""
    if credentials.get("method") == "oidc":
        detail = {"method": "oidc", "reason": str(credentials.get("reason"))}
        method = f" method=oidc reason={credentials.get('reason')!r}"
    audit_log.warning(
        "login-failed username=%r address=%s%s", username, client_address(request), method
    )
    # No actor: nobody proved who they are. The name tried is kept, cut to the column's size.
    record("login.failed", request=request, target=f"user:{(username or '')[:190]}", detail=detail)


@receiver(user_logged_out, dispatch_uid="backstop.audit_logout")
def audit_logout(sender, request, user, **kwargs):
    """A logout from the console or the admin."""
    name = user.get_username() if user is not None else None
    audit_log.info("logout username=%r address=%s", name, client_address(request))
    record("logout", request=request, actor=user, target=f"user:{name or ''}")


@receiver(post_save, sender=Token, dispatch_uid="backstop.audit_token_created")
def audit_token_created(sender, instance, created, **kwargs):
    """An API token made for a user (`POST /api/auth/token/` the first time, or the admin)."""
    if created:
        record("token.create", target=f"user:{instance.user.get_username()}")


def _kind(group_name: str) -> str:
    """What a group stands for in the audit log: a role, a team or another group."""
    if group_name in ROLE_ORDER:
        return "role"
    if group_name.startswith(TEAM_GROUP_PREFIX):
        return "team"
    return "group"


@receiver(m2m_changed, sender=User.groups.through, dispatch_uid="backstop.audit_groups")
def audit_group_membership(sender, instance, action, reverse, model, pk_set, **kwargs):
    """A user put in or taken out of a role or team group, from either side of the relation
    (`user.groups` or `group.user_set`; the admin, a command, the sign-on's group mapping)."""
    if action == "pre_clear":
        # The members or groups are gone after the clear: read them now.
        related = instance.user_set.all() if reverse else instance.groups.all()
        pk_set, verb = {item.pk for item in related}, "remove"
    elif action in ("post_add", "post_remove"):
        verb = action.removeprefix("post_")
    else:
        return
    for pk in sorted(pk_set or ()):
        user, group = (User.objects.get(pk=pk), instance) if reverse else (instance, None)
        group = group or Group.objects.get(pk=pk)
        record(
            f"{_kind(group.name)}.{verb}",
            target=f"user:{user.get_username()}",
            detail={"group": group.name},
        )


@receiver(post_save, sender=LogEntry, dispatch_uid="backstop.audit_admin_user_edits")
def audit_admin_user_edit(sender, instance, created, **kwargs):
    """A user added, changed or deleted in the Django admin, with the admin's own summary of
    the change (group memberships are recorded one by one above)."""
    if not created or instance.content_type.model_class() is not User:
        return
    record(
        f"user.{ADMIN_FLAGS.get(instance.action_flag, 'change')}",
        actor=instance.user,
        target=f"user:{instance.object_repr}",
        detail={"change": instance.get_change_message()},
    )


@receiver(post_save, sender=ReportSubscription, dispatch_uid="backstop.audit_report_saved")
def audit_report_subscription(sender, instance, created, **kwargs):
    """A report subscription created or changed (the admin is where they are edited)."""
    record(
        f"report.{'create' if created else 'change'}",
        target=f"report:{instance.pk}",
        detail={
            "name": instance.name,
            "scope": instance.scope,
            "team": str(instance.team or ""),
            "enabled": instance.enabled,
        },
    )


@receiver(post_delete, sender=ReportSubscription, dispatch_uid="backstop.audit_report_deleted")
def audit_report_subscription_deleted(sender, instance, **kwargs):
    """A report subscription deleted."""
    record("report.delete", target=f"report:{instance.pk}", detail={"name": instance.name})
