"""Writing the audit log (console.models.AuditEvent): one call per write, from wherever it is made.

`record("route.create", request=request, target=f"route:{route.pk}", detail={...})` takes the
actor and the client address from the request. The service functions every write goes through
(the API, the admin, the console and the commands alike) pass `actor=` instead: the address is
then the one of the request being served, which console.middleware.AuditRequestMiddleware makes
known here (`current_request`); code outside a request (commands, workers) records none.
"""

from __future__ import annotations

import contextvars
from datetime import UTC, datetime

from django.db.models import Q, QuerySet

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


# The columns of an exported event, in order (the CSV header and the JSON object's keys).
EXPORT_FIELDS = ("at", "actor", "action", "target", "detail", "address")


def search(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    actor: str = "",
    action: str = "",
    text: str = "",
) -> QuerySet[AuditEvent]:
    """Events newest first, narrowed by time (`since` inclusive, `until` exclusive), the actor's
    name, the action (`fault` matches `fault.inject`: a whole action or its domain) and text
    in the target. Used by the console's audit page and the API's export alike."""
    events = AuditEvent.objects.all()
    if since is not None:
        events = events.filter(at__gte=since)
    if until is not None:
        events = events.filter(at__lt=until)
    if actor:
        events = events.filter(actor_name=actor)
    if action:
        events = events.filter(Q(action=action) | Q(action__startswith=f"{action}."))
    if text:
        events = events.filter(target__icontains=text)
    return events.order_by("-at", "-id")


def parse_time(raw: str) -> datetime:
    """An ISO 8601 date and time as the audit filters take it (`2026-11-28T10:00:00Z`; without
    an offset, UTC; a date alone, its midnight UTC), in UTC. ValueError for anything else,
    also for a time that exists in no calendar the database keeps (an offset past UTC-12 on
    1 January of year 1)."""
    value = datetime.fromisoformat(raw.strip())
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        # In UTC: PostgreSQL refuses offsets beyond +-15:59, which Python accepts up to 24 h.
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"{raw!r} is before the first day of year 1 in UTC") from exc


def actions() -> list[str]:
    """The actions the log holds, for the audit page's choices."""
    return list(AuditEvent.objects.order_by("action").values_list("action", flat=True).distinct())
