"""The Backstop user of an OpenID Connect account, and its groups kept in step with the
provider's groups claim at every login."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from django.contrib.auth.models import Group, User
from django.db import IntegrityError, transaction

from console.models import OidcIdentity
from console.oidc.mapping import (
    USERNAME_MAX_LENGTH,
    claim_values,
    group_changes,
    username_base,
)

audit_log = logging.getLogger("backstop.audit")


class InvalidClaims(ValueError):
    """The verified ID token lacks what a login needs (a subject)."""


def user_for_login(
    issuer: str, claims: Mapping[str, object], *, groups_claim: str, group_map: Mapping[str, str]
) -> User:
    """The user that the provider account (`issuer`, `claims["sub"]`) signs in as, created at its
    first login, with its email and names and its groups of `group_map` updated from `claims`.

    The user is found by issuer and subject only, never by user name or email: a provider
    account never takes over a local account that happens to share its name.
    """
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise InvalidClaims("the ID token has no subject (sub)")
    with transaction.atomic():
        user = _user_of_identity(issuer, subject, claims)
        _update_profile(user, claims)
        sync_groups(user, claim_values(claims, groups_claim), group_map)
    return user


def sync_groups(user: User, claimed: frozenset[str], group_map: Mapping[str, str]) -> None:
    """Make `user` a member of exactly the groups of `group_map` that a value of `claimed` maps
    to; groups that are no value of `group_map` stay as they are."""
    managed = set(group_map.values())
    current = set(user.groups.filter(name__in=managed).values_list("name", flat=True))
    changes = group_changes(claimed, group_map, current)
    if changes.add:
        # A mapped group may not exist yet (a team named in the map before anyone created it).
        user.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in changes.add))
    if changes.remove:
        user.groups.remove(*Group.objects.filter(name__in=changes.remove))
    if changes.add or changes.remove:
        audit_log.info(
            "oidc-groups username=%r joined=%s left=%s",
            user.get_username(),
            sorted(changes.add),
            sorted(changes.remove),
        )


def _user_of_identity(issuer: str, subject: str, claims: Mapping[str, object]) -> User:
    identity = (
        OidcIdentity.objects.select_related("user").filter(issuer=issuer, subject=subject).first()
    )
    if identity is not None:
        return identity.user
    try:
        with transaction.atomic():
            user = User(username=_free_username(username_base(claims)))
            user.set_unusable_password()  # signs in through the provider only
            user.save()
            OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    except IntegrityError:
        # The same person's first login in another tab or worker created it meanwhile.
        return OidcIdentity.objects.select_related("user").get(issuer=issuer, subject=subject).user
    audit_log.info(
        "oidc-user-created username=%r issuer=%s subject=%r", user.username, issuer, subject
    )
    return user


def _free_username(base: str) -> str:
    """`base`, or `base-2`, `base-3`... if a user (local or not) already has that name."""
    candidate, suffix = base, 1
    while User.objects.filter(username__iexact=candidate).exists():
        suffix += 1
        tail = f"-{suffix}"
        candidate = base[: USERNAME_MAX_LENGTH - len(tail)] + tail
    return candidate


def _update_profile(user: User, claims: Mapping[str, object]) -> None:
    """Email and names as the provider has them now (the provider is their source of truth)."""
    fields = {"email": "email", "first_name": "given_name", "last_name": "family_name"}
    changed = []
    for field, claim in fields.items():
        value = claims.get(claim)
        limit = User._meta.get_field(field).max_length
        if isinstance(value, str) and value[:limit] != getattr(user, field):
            setattr(user, field, value[:limit])
            changed.append(field)
    if changed:
        user.save(update_fields=changed)
