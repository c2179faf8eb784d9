"""Changing the fault-tolerance policy: every change is a new validated version with its author."""

from __future__ import annotations

from django.db import transaction

from console.models import Policy
from console.policy.config import PolicyConfigError


class PolicyRejected(Exception):
    """The change would make an invalid policy; `errors` maps field names to messages."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


@transaction.atomic
def change_policy(changes: dict, *, user=None, reason: str = "") -> Policy:
    """Write a new policy version: the version in force with `changes` applied.

    Unknown fields and invalid values are refused with a message per field; nothing is written then.
    """
    current = Policy.current()
    unknown = sorted(set(changes) - set(Policy.threshold_field_names()))
    if unknown:
        raise PolicyRejected({name: f"{name}: not a policy field" for name in unknown})
    values = {name: getattr(current, name) for name in Policy.threshold_field_names()}
    values.update(changes)
    candidate = Policy(
        **values,
        reason=reason,
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )
    try:
        candidate.to_config().validate()
    except PolicyConfigError as exc:
        raise PolicyRejected(exc.errors) from exc
    candidate.save()
    return candidate
