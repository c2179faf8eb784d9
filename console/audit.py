"""Audit log lines for sign-ins: who, from which address, what happened.

One line per login, failed login and logout on the `backstop.audit` logger, e.g.
`login-failed username='ada' address=203.0.113.9`; a single sign-on adds `method=oidc` (and
why, when refused). The address is REMOTE_ADDR, which console.middleware.TrustedProxyMiddleware
has already set to the real client behind a trusted proxy. Policy changes and faults are audited
in the database (who and when, with a reason).
"""

import logging

from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver

from console.auth_throttle import client_address
from console.oidc import OIDC_BACKEND

audit_log = logging.getLogger("backstop.audit")


@receiver(user_logged_in, dispatch_uid="backstop.audit_login")
def audit_login(sender, request, user, **kwargs):
    """A successful login (login page, admin, single sign-on); single sign-on says so."""
    # login() records the backend in the session before it sends the signal.
    session = getattr(request, "session", None)
    signed_in_by = session.get(BACKEND_SESSION_KEY) if session is not None else None
    method = " method=oidc" if signed_in_by == OIDC_BACKEND else ""
    audit_log.info(
        "login username=%r address=%s%s", user.get_username(), client_address(request), method
    )


@receiver(user_login_failed, dispatch_uid="backstop.audit_login_failed")
def audit_login_failed(sender, credentials, request=None, **kwargs):
    """A failed login (wrong password, unknown user, refused while locked out, or a refused
    single sign-on, which says so and why)."""
    username = credentials.get("username")
    method = ""
    if credentials.get("method") == "oidc":
        method = f" method=oidc reason={credentials.get('reason')!r}"
    audit_log.warning(
        "login-failed username=%r address=%s%s",
        username if isinstance(username, str) else None,
        client_address(request),
        method,
    )


@receiver(user_logged_out, dispatch_uid="backstop.audit_logout")
def audit_logout(sender, request, user, **kwargs):
    """A logout from the console or the admin."""
    name = user.get_username() if user is not None else None
    audit_log.info("logout username=%r address=%s", name, client_address(request))
