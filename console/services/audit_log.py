"""Writing the audit log (console.models.AuditEvent): one call per write, from wherever it is made.

`record("route.create", request=request, target=f"route:{route.pk}", detail={...})` takes the
actor and the client address from the request. The service functions every write goes through
(the API, the admin, the console and the commands alike) pass `actor=` instead: the address is
then the one of the request being served, which console.middleware.AuditRequestMiddleware makes
known here (`current_request`); code outside a request (commands, workers) records none.
"""

from __future__ import annotations

import contextvars

from console.auth_throttle import client_address
from console.models import AuditEvent

# The HTTP request this thread or task is serving, if any (set by AuditRequestMiddleware).
current_request: contextvars.ContextVar = contextvars.ContextVar("audit_request", default=None)


def job_target(job) -> str:
    """How the audit log names a job."""
    return f"job:{job.pk}"


def record(action: str, *, request=None, actor=None, target: str = "", detail=None) -> AuditEvent:
    """Append one event to the audit log and return it."""
    request = request if request is not None else current_request.get()
    if actor is None and request is not None:
        user = getattr(request, "user", None)
        actor = user if user is not None and user.is_authenticated else None
    if actor is not None and not actor.is_authenticated:
        actor = None
    return AuditEvent.objects.create(
        actor=actor,
        actor_name=actor.get_username() if actor is not None else "",
        action=action,
        target=target,
        detail=detail or {},
        address=client_address(request) or None,
    )
