"""Login throttling: lock a username or an address out after too many failed logins.

Every way in (the HTML login, the admin login, the API token endpoint) authenticates through
`django.contrib.auth.authenticate()`, so the rules live in two places only:

- `ThrottledModelBackend` (the only entry in AUTHENTICATION_BACKENDS) refuses to check a password
  while the username or the client address is locked out, and clears both counters after a
  successful login;
- the `user_login_failed` receiver below counts each failure, per username and per address.

Counters live in Django's cache (RedisCache on REDIS_URL), so every web worker sees the same
counts. A counter starts with the first failure and expires LOGIN_FAILURE_WINDOW_S later: at most
LOGIN_FAILURE_LIMIT failures (default 5 in 900 s) per username and per address.

The client address is REMOTE_ADDR. Behind a reverse proxy, list the proxy in TRUSTED_PROXIES:
console.middleware.TrustedProxyMiddleware then sets REMOTE_ADDR to the real client from
X-Forwarded-For before this code runs. The header is never read here, because a client that
reaches the server directly can forge it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_login_failed
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.dispatch import receiver
from rest_framework import status
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.response import Response

LOCKED_OUT_FLAG = "login_locked_out"
audit_log = logging.getLogger("backstop.audit")


def failure_limit() -> int:
    return settings.LOGIN_FAILURE_LIMIT


def failure_window_s() -> int:
    return settings.LOGIN_FAILURE_WINDOW_S


def lockout_message() -> str:
    minutes = max(1, round(failure_window_s() / 60))
    return (
        f"Too many failed login attempts. This account or address is locked for up to "
        f"{minutes} minutes; try again later."
    )


def client_address(request) -> str:
    """The address the request came from ('' when there is no request, e.g. in a shell)."""
    if request is None:
        return ""
    return request.META.get("REMOTE_ADDR", "") or ""


def _keys(username: str | None, address: str) -> list[str]:
    # Usernames are hashed so odd characters cannot break a cache key; case-folded so "Ada" and
    # "ada" share a counter.
    keys = []
    if isinstance(username, str) and username:
        digest = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
        keys.append(f"login-fail:user:{digest}")
    if address:
        keys.append(f"login-fail:ip:{address}")
    return keys


def failures(username: str | None, address: str) -> int:
    """The larger of the username's and the address's failure counts in the current window."""
    counts = cache.get_many(_keys(username, address))
    return max(counts.values(), default=0)


def is_locked_out(username: str | None, address: str) -> bool:
    """True when the username or the address has reached LOGIN_FAILURE_LIMIT failures."""
    return failures(username, address) >= failure_limit()


def record_failure(username: str | None, address: str) -> None:
    """Count one failed login for the username and for the address."""
    for key in _keys(username, address):
        # add() starts the window only for the first failure; incr() keeps the key's expiry.
        cache.add(key, 0, timeout=failure_window_s())
        try:
            cache.incr(key)
        except ValueError:
            # The key expired between add() and incr(): this failure opens a new window.
            cache.add(key, 1, timeout=failure_window_s())


def reset(username: str | None, address: str) -> None:
    """Forget the failures of the username and of the address (after a successful login).

    The address counter is cleared too, so a person who mistyped a few times and then logged in
    is not locked out of their next attempt; guessing other accounts from that address is still
    bounded by each account's own counter.
    """
    cache.delete_many(_keys(username, address))


class ThrottledModelBackend(ModelBackend):
    """ModelBackend that refuses locked-out usernames and addresses before checking passwords.

    Raising PermissionDenied stops `authenticate()` at once (no other backend is tried) and makes
    it send `user_login_failed`. The request is flagged with `login_locked_out` so the login page
    can say why.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(self._username_field())
        address = client_address(request)
        if is_locked_out(username, address):
            if request is not None:
                setattr(request, LOCKED_OUT_FLAG, True)
            raise PermissionDenied(lockout_message())
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None:
            reset(username, address)
        return user

    @staticmethod
    def _username_field() -> str:
        from django.contrib.auth import get_user_model

        return get_user_model().USERNAME_FIELD


# Connected when this module is imported; authenticate() imports the backend above before it can
# send user_login_failed, so no failure goes uncounted.
@receiver(user_login_failed, dispatch_uid="backstop.count_login_failure")
def count_login_failure(sender, credentials, request=None, **kwargs):
    """Count every failed login (wrong password, unknown user, or an attempt while locked out)."""
    record_failure(credentials.get("username"), client_address(request))


class LockoutAwareAdminAuthenticationForm(AdminAuthenticationForm):
    """The admin login form, saying "locked out" instead of "wrong password" when it is so."""

    def clean(self):
        try:
            return super().clean()
        except ValidationError:
            if getattr(self.request, LOCKED_OUT_FLAG, False):
                raise ValidationError(lockout_message(), code="locked_out") from None
            raise


class ThrottledObtainAuthToken(ObtainAuthToken):
    """POST /api/auth/token/: DRF's token view, answering 429 while locked out.

    The check runs before the password is looked at, so a locked-out client learns nothing about
    whether its guess was right.
    """

    def post(self, request, *args, **kwargs):
        # A body that is not an object, or a username that is not a string (a list, a number,
        # null): AuthTokenSerializer refuses it with a 400; only the address counts towards a
        # lockout.
        data = request.data if isinstance(request.data, Mapping) else {}
        username = data.get("username")
        if not isinstance(username, str):
            username = None
        if is_locked_out(username, client_address(request)):
            # Count it: hammering a locked account keeps the address's counter at the limit.
            record_failure(username, client_address(request))
            return Response(
                {"error": {"status": 429, "code": "locked_out", "detail": lockout_message()}},
                status=status.HTTP_429_TOO_MANY_REQUESTS,
            )
        response = super().post(request, *args, **kwargs)
        if response.status_code == status.HTTP_200_OK:
            # The token endpoint does not log the user in, so no user_logged_in signal: log here.
            audit_log.info("token username=%r address=%s", username, client_address(request))
        return response


obtain_auth_token = ThrottledObtainAuthToken.as_view()
