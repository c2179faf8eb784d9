"""Role checks for code paths that are neither API views nor admin pages.

The API checks roles with `console.api.permissions.RolePermission` and the admin with each
ModelAdmin's `has_*_permission`; everything else that acts on behalf of a person uses these:

- management commands that act: `user = require_role(options["as_user"], OPERATOR)` at the top of
  `handle()`. The exception is a CommandError, so Django prints "CommandError: <message>" and
  exits with status 1; no try/except is needed.
- Dash callbacks (django-plotly-dash passes `user` to callbacks registered with
  `expanded_callback`): call `check_role(kwargs["user"], ADMIN)` before acting, or decorate the
  callback with `@role_required(ADMIN)`. Both raise RoleRequired, which is also a Django
  PermissionDenied, so a callback that lets it escape answers 403 instead of acting.
"""

from __future__ import annotations

import functools

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError

from console.roles import ROLE_ORDER, has_role, role_of


class RoleRequired(PermissionDenied, CommandError):
    """The user is missing, inactive or below the role an action needs; the message says which."""


def _require_known_role(role: str) -> None:
    if role not in ROLE_ORDER:
        # A typo in calling code must not silently allow or deny everything.
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLE_ORDER)}")


def check_role(user, role: str) -> None:
    """Raise RoleRequired unless `user` (a User or AnonymousUser) has `role` or a higher one."""
    _require_known_role(role)
    if user is None or not getattr(user, "is_authenticated", False):
        raise RoleRequired(f"this needs the {role} role; log in first")
    if not user.is_active:
        raise RoleRequired(f"user {user.get_username()!r} is inactive")
    if not has_role(user, role):
        current = role_of(user) or "no role"
        raise RoleRequired(
            f"user {user.get_username()!r} has {current}; this needs the {role} role or higher"
        )


def require_role(user_or_username, role: str):
    """Return the user (looked up by name when given a string) once it is known to hold `role`.

    Raises RoleRequired (a CommandError and a PermissionDenied) naming the user, the role it has
    and the role needed.
    """
    _require_known_role(role)
    user = user_or_username
    if isinstance(user_or_username, str):
        model = get_user_model()
        try:
            user = model.objects.get(**{model.USERNAME_FIELD: user_or_username})
        except model.DoesNotExist:
            raise RoleRequired(f"no user named {user_or_username!r}") from None
    check_role(user, role)
    return user


def role_required(role: str):
    """Decorator for Dash expanded callbacks: refuse unless kwargs['user'] has `role`."""
    _require_known_role(role)

    def decorate(callback):
        @functools.wraps(callback)
        def wrapper(*args, **kwargs):
            user = kwargs.get("user")
            if user is None and kwargs.get("request") is not None:
                user = kwargs["request"].user
            check_role(user, role)
            return callback(*args, **kwargs)

        return wrapper

    return decorate
