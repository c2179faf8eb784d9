"""Changing the fault-tolerance policy: every change is a new validated version with its author.

History is never rewritten: a change, and a revert too, writes a new version with who, when and
why; `Policy.changes_from_previous()` gives what each version changed.

The controller calls `policy_in_force()` at the start of every supervision cycle (it never keeps
a Policy between cycles), so a version written here takes effect from the controller's next cycle.
"""

from __future__ import annotations

from django.db import transaction

from console.models import Policy
from console.policy.config import PolicyConfigError
from console.services import audit_log


class PolicyRejected(Exception):
    """The change would make an invalid policy; `errors` maps field names to messages."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def policy_in_force() -> Policy:
    """The version the controller must use now: the newest one (defaults on a fresh database).

    Call it once per supervision cycle and do not cache the result across cycles.
    """
    return Policy.current()


@transaction.atomic
def change_policy(changes: dict, *, user=None, reason: str = "") -> Policy:
    """Write a new policy version: the version in force with `changes` applied.

    A reason is required. Unknown fields, invalid values and a missing reason are refused with a
    message per field; nothing is written then.
    """
    # Lock the newest version first, then read the version in force: a second admin changing the
    # policy at the same time waits here and then builds on the first one's version instead of
    # silently dropping it.
    list(Policy.objects.select_for_update().order_by("-version")[:1])
    current = Policy.current()
    errors: dict[str, str] = {}
    for name in sorted(set(changes) - set(Policy.threshold_field_names())):
        errors[name] = f"{name}: not a policy field"
    reason = (reason or "").strip()
    if not reason:
        errors["reason"] = "reason: say why the policy changes"
    values = {name: getattr(current, name) for name in Policy.threshold_field_names()}
    values.update({k: v for k, v in changes.items() if k in values})
    candidate = Policy(
        **values,
        reason=reason,
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )
    try:
        candidate.to_config().validate()
    except PolicyConfigError as exc:
        errors.update(exc.errors)
    if errors:
        raise PolicyRejected(errors)
    candidate.save()
    audit_log.record(
        "policy.change",
        actor=user,
        target=f"policy:v{candidate.version}",
        detail={
            "reason": reason,
            "changes": {
                name: [getattr(current, name), value]
                for name, value in values.items()
                if getattr(current, name) != value
            },
        },
    )
    return candidate


def revert_policy(version: int, *, user=None) -> Policy:
    """Put version `version`'s values back in force as a NEW version with reason "revert to vN".

    Raises Policy.DoesNotExist when there is no such version.
    """
    target = Policy.objects.get(version=version)
    values = {name: getattr(target, name) for name in Policy.threshold_field_names()}
    return change_policy(values, user=user, reason=f"revert to v{target.version}")


def policy_history(limit: int = 200) -> list[tuple[Policy, dict[str, list]]]:
    """The newest `limit` versions, newest first, each with `{field: [old, new]}` of its change."""
    # One extra row gives the oldest listed version its predecessor without another query.
    versions = list(Policy.objects.select_related("created_by").order_by("-version")[: limit + 1])
    history = []
    for index, policy in enumerate(versions[:limit]):
        previous = versions[index + 1] if index + 1 < len(versions) else None
        history.append((policy, Policy.diff(previous, policy)))
    return history
