"""Writing the audit log (console.models.AuditEvent): one call per write, from wherever it is made.

`record("route.create", request=request, target=f"route:{route.pk}", detail={...})` takes the
actor and the client address from the request; code without a request (management commands,
workers acting for a user) passes `actor=` instead and no address.
"""

from __future__ import annotations

from console.auth_throttle import client_address
from console.models import AuditEvent


def record(action: str, *, request=None, actor=None, target: str = "", detail=None) -> AuditEvent:
    """Append one event to the audit log and return it."""
    if actor is None and request is not None:
        user = getattr(request, "user", None)
        actor = user if user is not None and user.is_authenticated else None
    return AuditEvent.objects.create(
        actor=actor,
        actor_name=actor.get_username() if actor is not None else "",
        action=action,
        target=target,
        detail=detail or {},
        address=client_address(request) or None,
    )
