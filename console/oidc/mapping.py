"""The groups claim of an OpenID Connect login mapped onto Django groups; no Django here.

OIDC_GROUP_MAP maps values of the provider's groups claim to Django group names, e.g.
`{"sre-leads": "admin", "sre": "operator", "payments": "team:payments"}` (a team's group). At
each login the user joins the mapped groups whose claim value is present and leaves the mapped
groups whose claim values are all absent; groups that no value maps to are Backstop's own and
never touched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Django's default username validator allows these; anything else becomes "-".
_USERNAME_UNSAFE = re.compile(r"[^\w.@+-]+")
USERNAME_MAX_LENGTH = 150


def parse_group_map(raw: str) -> dict[str, str]:
    """OIDC_GROUP_MAP's value: a JSON object from claim value to Django group name ('' is {}).

    Raises ValueError naming what is wrong, so a typo stops the process at start-up instead of
    silently giving nobody a role.
    """
    if not raw.strip():
        return {}
    mapping = json.loads(raw)  # JSONDecodeError is a ValueError
    if not isinstance(mapping, dict):
        raise ValueError('expected a JSON object such as {"sre-leads": "admin"}')
    for claim_value, group in mapping.items():
        if not isinstance(group, str) or not group.strip():
            raise ValueError(f"the group for {claim_value!r} must be a non-empty string")
    return {claim_value: group.strip() for claim_value, group in mapping.items()}


def claim_values(claims: Mapping[str, object], claim_name: str) -> frozenset[str]:
    """The values of the claim `claim_name`: a list of strings, or one string (some providers
    send a single group that way). Missing, null or other types count as no value."""
    value = claims.get(claim_name)
    if isinstance(value, str):
        return frozenset({value})
    if isinstance(value, list | tuple):
        return frozenset(item for item in value if isinstance(item, str))
    return frozenset()


@dataclass(frozen=True)
class GroupChanges:
    """The Django groups a user joins and leaves at a login."""

    add: frozenset[str]
    remove: frozenset[str]


def group_changes(
    claimed: Iterable[str], group_map: Mapping[str, str], current: Iterable[str]
) -> GroupChanges:
    """What to change in a user's groups, who has the groups `current` and whose groups claim
    holds `claimed`: join every group mapped from a claimed value, leave every mapped group that
    no claimed value maps to, and leave any group that is no value of `group_map` alone."""
    wanted = {group_map[value] for value in claimed if value in group_map}
    managed = set(group_map.values())
    current = set(current)
    return GroupChanges(
        add=frozenset(wanted - current), remove=frozenset((managed - wanted) & current)
    )


def username_base(claims: Mapping[str, object]) -> str:
    """The user name a new user signed in through OpenID Connect asks for: the provider's
    `preferred_username`, else its email address, else its subject, in the characters Django
    allows (the caller makes it unique)."""
    for claim in ("preferred_username", "email", "sub"):
        value = claims.get(claim)
        if isinstance(value, str) and value.strip():
            cleaned = _USERNAME_UNSAFE.sub("-", value.strip()).strip("-")
            if cleaned:
                return cleaned[:USERNAME_MAX_LENGTH]
    return "oidc-user"
