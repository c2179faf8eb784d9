"""Roles as Django groups: viewer (read), operator (also run jobs and inject faults), admin (also
change the policy). Each role includes the ones below it; superusers are admins."""

from __future__ import annotations

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"

# Lowest to highest; a user's role is the highest group they belong to.
ROLE_ORDER = (VIEWER, OPERATOR, ADMIN)


def role_of(user) -> str | None:
    """The highest role of `user`, or None for anonymous users and users in no role group."""
    if user is None or not user.is_authenticated:
        return None
    if user.is_superuser:
        return ADMIN
    groups = set(user.groups.values_list("name", flat=True))
    for role in reversed(ROLE_ORDER):
        if role in groups:
            return role
    return None


def has_role(user, required: str) -> bool:
    """True when `user`'s role is `required` or higher."""
    role = role_of(user)
    return role is not None and ROLE_ORDER.index(role) >= ROLE_ORDER.index(required)
