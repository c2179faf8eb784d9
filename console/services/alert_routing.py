"""Alert routing: the one way a condition pages someone.

Every condition, wherever it is decided, calls

- `raise_alert(key, event, ...)` each time it finds the condition true. The key names the
  condition (`job-unprotected:<job key>:count`), not the check: the first call opens the alert and
  queues one delivery per matching route; repeats only count (`seen`, `last_seen_at`), so a
  condition checked every cycle pages once. A key raised again within the policy's
  `alert_reopen_throttle_s` after it resolved stays resolved (a flapping condition pages once).
- `clear_alert(key)` each time it finds the condition false: an open alert resolves and every
  route that got (or is getting) its trigger gets a resolve.

Both only write rows and enqueue one message per delivery on the `alerts` queue after the
commit; the controller never waits for a receiver. `deliver(delivery_id)` (run by the alerts
worker, workers/alerting.py) makes one attempt: it claims the row, sends it with a bounded
timeout and records the outcome; after a failure it sets when to try again (exponential
backoff, console.alerting_payloads.retry_delay_s). `due_deliveries()` is what beat's sweep
re-queues, so a message lost with a worker or the broker delays a delivery but never loses it.
"""

from __future__ import annotations

import logging
import secrets
import urllib.error
import urllib.request
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone
from kombu.exceptions import OperationalError

from console import alerting_payloads as payloads
from console.models import (
    Alert,
    AlertDelivery,
    AlertRoute,
    Job,
    Policy,
    Team,
    split_recipients,
)
from console.services.teams import jobs_visible_to, sees_every_team, teams_of
from infra import tasks
from infra.queues import ALERTS_QUEUE

log = logging.getLogger(__name__)

# A receiver that has not answered within this many seconds counts as down for this attempt:
# a hung receiver cannot hold the worker.
HTTP_TIMEOUT_S = 5.0
# A claimed delivery is not tried by another worker for this long (one attempt's upper bound).
CLAIM_S = HTTP_TIMEOUT_S + 10.0
# beat's sweep re-queues a pending delivery only once it is this overdue, so it does not race
# the message (first send or retry) already on its way.
SWEEP_GRACE_S = 10.0


def new_secret() -> str:
    """A fresh signing secret / routing key for a route that was given none."""
    return secrets.token_hex(16)


def route_audit(route: AlertRoute) -> dict:
    """The route's fields as the audit log keeps them (no secret), for the API and the admin."""
    return {
        "name": route.name,
        "channel": route.channel,
        "target": route.target,
        "events": route.events,
        "min_severity": route.min_severity,
        "teams": sorted(team.name for team in route.teams.all()),
        "jobs": sorted(job.pk for job in route.jobs.all()),
        "enabled": route.enabled,
    }


def routes_for(alert: Alert):
    """The enabled routes that ask for `alert`: its event (or all), its severity or more, and its
    job among theirs or owned by one of their teams (a route naming neither hears every job;
    an alert without a job reaches only those)."""
    matching = []
    candidates = AlertRoute.objects.filter(enabled=True).prefetch_related("teams", "jobs")
    for route in candidates:
        if route.events and alert.event not in route.events:
            continue
        if not payloads.severity_at_least(alert.severity, route.min_severity):
            continue
        team_ids = {team.pk for team in route.teams.all()}
        job_ids = {job.pk for job in route.jobs.all()}
        if team_ids or job_ids:
            job = alert.job
            if job is None or not (job.pk in job_ids or job.team_id in team_ids):
                continue
        matching.append(route)
    return matching


def raise_alert(
    key: str,
    event: str,
    *,
    job: Job | None = None,
    summary: str,
    details: dict | None = None,
    severity: str | None = None,
    now: datetime | None = None,
) -> Alert:
    """The condition `key` holds (see the module's docstring); returns its alert. `severity`
    defaults to the event's (console.alerting_payloads.EVENTS)."""
    now = now or timezone.now()
    severity = severity or payloads.EVENTS[event][0]
    details = details or {}
    queued: list[int] = []
    with transaction.atomic():
        alert = Alert.objects.select_for_update().filter(key=key).first()
        if alert is None:
            alert = _open(key, event, severity, job, summary, details, now)
            if alert is None:  # another process opened it between our read and insert
                return Alert.objects.get(key=key)
            queued = _queue(alert, routes_for(alert), payloads.TRIGGER, now)
        elif alert.state == Alert.State.OPEN:
            alert.last_seen_at, alert.seen = now, alert.seen + 1
            alert.details = details
            alert.save(update_fields=["last_seen_at", "seen", "details"])
        elif now - alert.resolved_at < timedelta(seconds=_reopen_throttle_s()):
            alert.last_seen_at = now
            alert.save(update_fields=["last_seen_at"])
        else:
            alert.state, alert.severity, alert.summary, alert.details = (
                Alert.State.OPEN,
                severity,
                summary[:300],
                details,
            )
            alert.opened_at = alert.last_seen_at = now
            alert.resolved_at, alert.seen = None, 1
            alert.save()
            queued = _queue(alert, routes_for(alert), payloads.TRIGGER, now)
        transaction.on_commit(lambda: enqueue(queued))
    return alert


def clear_alert(key: str, *, now: datetime | None = None) -> Alert | None:
    """The condition `key` no longer holds: resolve its open alert and queue a resolve for each
    route that got its trigger or is still getting it. Returns the alert (None: none open)."""
    now = now or timezone.now()
    with transaction.atomic():
        alert = Alert.objects.select_for_update().filter(key=key, state=Alert.State.OPEN).first()
        if alert is None:
            return None
        alert.state, alert.resolved_at = Alert.State.RESOLVED, now
        alert.save(update_fields=["state", "resolved_at"])
        triggered = AlertRoute.objects.filter(
            deliveries__alert=alert,
            deliveries__action=AlertDelivery.Action.TRIGGER,
            deliveries__created_at__gte=alert.opened_at,
            deliveries__status__in=(AlertDelivery.Status.PENDING, AlertDelivery.Status.DELIVERED),
        ).distinct()
        queued = _queue(alert, list(triggered), payloads.RESOLVE, now)
        transaction.on_commit(lambda: enqueue(queued))
    return alert


def clear_alerts_of(job: Job, prefix: str, keep: set[str], *, now: datetime | None = None) -> int:
    """Clear the open alerts of `job` whose key starts with `prefix`, except those in `keep` (the
    ones the caller just raised): a condition per stage clears for stages no longer in it."""
    keys = Alert.objects.filter(
        job=job, state=Alert.State.OPEN, key__startswith=prefix
    ).values_list("key", flat=True)
    stale = [key for key in keys if key not in keep]
    for key in stale:
        clear_alert(key, now=now)
    return len(stale)


def _reopen_throttle_s() -> float:
    return Policy.current().alert_reopen_throttle_s


def _open(key, event, severity, job, summary, details, now) -> Alert | None:
    try:
        with transaction.atomic():
            return Alert.objects.create(
                key=key,
                event=event,
                severity=severity,
                job=job,
                summary=summary[:300],
                details=details,
                opened_at=now,
                last_seen_at=now,
            )
    except IntegrityError:
        return None


def _queue(alert: Alert, routes, action: str, now: datetime) -> list[int]:
    rows = AlertDelivery.objects.bulk_create(
        AlertDelivery(alert=alert, route=route, action=action, created_at=now, next_attempt_at=now)
        for route in routes
    )
    return [row.pk for row in rows]


def enqueue(delivery_ids: list[int]) -> None:
    """One message per delivery for the alerts worker. A broker that cannot take it now is only
    logged: the delivery is pending in the database and beat's sweep sends it."""
    for delivery_id in delivery_ids:
        try:
            tasks.send(tasks.DELIVER_ALERT, delivery_id, queue=ALERTS_QUEUE)
        except (OperationalError, OSError) as exc:
            log.warning("delivery %s not queued (%s); the sweep will send it", delivery_id, exc)


def due_deliveries(now: datetime | None = None, grace_s: float = SWEEP_GRACE_S) -> list[int]:
    """Pending deliveries overdue by more than `grace_s`: their message was lost, or is
    waiting for a busy worker; re-queued by the sweep (a second message is harmless: `deliver`
    claims the row first)."""
    cutoff = (now or timezone.now()) - timedelta(seconds=grace_s)
    return list(
        AlertDelivery.objects.filter(
            status=AlertDelivery.Status.PENDING, next_attempt_at__lte=cutoff
        ).values_list("pk", flat=True)[:500]
    )


def deliver(delivery_id: int, now: datetime | None = None) -> float | None:
    """One attempt at delivery `delivery_id`. Returns the seconds until it should be tried
    again (it failed, or waits for its trigger), or None (delivered, given up, or not ours to
    try now: another worker claimed it, or it is not due)."""
    now = now or timezone.now()
    claimed = AlertDelivery.objects.filter(
        pk=delivery_id,
        status=AlertDelivery.Status.PENDING,
        next_attempt_at__lte=now + timedelta(seconds=0.5),
    ).update(next_attempt_at=now + timedelta(seconds=CLAIM_S))
    if not claimed:
        return None
    delivery = AlertDelivery.objects.select_related("alert", "alert__job", "route").get(
        pk=delivery_id
    )
    if delivery.action == AlertDelivery.Action.RESOLVE and _trigger_pending(delivery):
        # A resolve overtaking its trigger would leave the receiver with an open incident.
        delivery.next_attempt_at = now + timedelta(seconds=1)
        delivery.save(update_fields=["next_attempt_at"])
        return 1.0
    try:
        status = send(delivery.route, facts_of(delivery), now.timestamp())
    except (OSError, urllib.error.URLError, ValueError, SendFailed) as exc:
        return _failed(delivery, exc, now)
    delivery.status = AlertDelivery.Status.DELIVERED
    delivery.attempts += 1
    delivery.response_status = status
    delivery.delivered_at = timezone.now()
    delivery.last_error = ""
    delivery.save()
    log.info("alert %s %s delivered to %s", delivery.alert.key, delivery.action, delivery.route)
    return None


def _trigger_pending(delivery: AlertDelivery) -> bool:
    return AlertDelivery.objects.filter(
        alert=delivery.alert,
        route=delivery.route,
        action=AlertDelivery.Action.TRIGGER,
        status=AlertDelivery.Status.PENDING,
        created_at__lte=delivery.created_at,
    ).exists()


def _failed(delivery: AlertDelivery, exc: Exception, now: datetime) -> float | None:
    delivery.attempts += 1
    # A URLError wraps the cause (refused, timed out): its reason says it without the wrapper.
    delivery.last_error = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"[:500]
    delivery.response_status = getattr(exc, "status", None)
    retry_in = None
    if delivery.attempts >= payloads.MAX_ATTEMPTS:
        delivery.status = AlertDelivery.Status.FAILED
    else:
        retry_in = payloads.retry_delay_s(delivery.attempts)
        delivery.next_attempt_at = now + timedelta(seconds=retry_in)
    delivery.save()
    log.warning(
        "alert %s %s to %s failed (attempt %d): %s",
        delivery.alert.key,
        delivery.action,
        delivery.route,
        delivery.attempts,
        delivery.last_error,
    )
    return retry_in


class SendFailed(Exception):
    """The receiver answered, but not with success."""

    def __init__(self, status: int, body: str):
        self.status = status
        super().__init__(f"HTTP {status}: {body[:200]}")


def facts_of(delivery: AlertDelivery) -> payloads.AlertFacts:
    """What the channels say about the delivery's alert."""
    alert, job = delivery.alert, delivery.alert.job
    source = f"job {job.name} (id {job.pk})" if job else "backstop"
    link = f"{settings.CONSOLE_BASE_URL}/console/jobs/{job.pk}/" if job else ""
    return payloads.AlertFacts(
        key=alert.key,
        event=alert.event,
        severity=alert.severity,
        action=delivery.action,
        summary=alert.summary,
        source=source,
        details=alert.details,
        opened_at=alert.opened_at.timestamp(),
        resolved_at=alert.resolved_at.timestamp() if alert.resolved_at else None,
        link=link,
    )


def send(route: AlertRoute, facts: payloads.AlertFacts, now: float) -> int | None:
    """Send one alert on the route's channel; returns the HTTP status (None for email). Raises
    on any failure (the caller retries)."""
    channel = route.channel
    if channel == AlertRoute.Channel.EMAIL:
        subject, body = payloads.email_message(facts, settings.EMAIL_SUBJECT_PREFIX)
        EmailMessage(
            subject, body, settings.DEFAULT_FROM_EMAIL, split_recipients(route.target)
        ).send(fail_silently=False)
        return None
    if channel == AlertRoute.Channel.WEBHOOK:
        request = payloads.webhook_request(route.target, route.secret, facts, now)
    elif channel == AlertRoute.Channel.SLACK:
        request = payloads.slack_request(route.target, facts)
    else:
        request = payloads.pagerduty_request(route.target, route.secret, facts)
    return post(request)


def post(request: payloads.HttpRequest) -> int:
    """POST the request within HTTP_TIMEOUT_S; returns its 2xx status, raises otherwise."""
    if not request.url.startswith(("http://", "https://")):
        raise ValueError(f"not an http(s) URL: {request.url!r}")
    http_request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        request.url, data=request.body, headers=request.headers, method="POST"
    )
    try:
        with urllib.request.urlopen(http_request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310
            return response.status
    except urllib.error.HTTPError as exc:
        raise SendFailed(exc.code, exc.read().decode(errors="replace")) from exc


def alerts_visible_to(user, alerts=None):
    """`alerts` (every alert by default) that `user` may see: those of the jobs of their teams,
    and those of no job (admins see all), as the jobs themselves (console.services.teams)."""
    alerts = Alert.objects.all() if alerts is None else alerts
    return alerts.filter(Q(job__isnull=True) | Q(job__in=jobs_visible_to(user).values("pk")))


def deliveries_visible_to(user, deliveries=None):
    """`deliveries` (every one by default) of the alerts `user` may see."""
    deliveries = AlertDelivery.objects.all() if deliveries is None else deliveries
    return deliveries.filter(alert__in=alerts_visible_to(user).values("pk"))


def routes_visible_to(user, routes=None):
    """`routes` (every one by default) that `user` may see: admins all; others the routes that
    name no team of which they are not a member and no job they may not see (a route names
    them; seeing it would tell another team's jobs apart)."""
    routes = AlertRoute.objects.all() if routes is None else routes
    if sees_every_team(user):
        return routes
    others = Team.objects.exclude(pk__in=teams_of(user).values("pk"))
    hidden = Job.objects.exclude(pk__in=jobs_visible_to(user).values("pk"))
    return routes.exclude(teams__in=others).exclude(jobs__in=hidden)


def open_alert_rows(user, limit: int = 50) -> list[dict]:
    """The open alerts `user` may see, newest first, as the console lists them; one query."""
    rows = alerts_visible_to(user, Alert.objects.filter(state=Alert.State.OPEN))
    rows = rows.order_by("-opened_at", "-id")[:limit]
    return list(
        rows.values("key", "event", "severity", "summary", "seen", "opened_at", "last_seen_at")
    )


def route_rows(user) -> list[dict]:
    """The routes `user` may see as the console lists them (no secret); two queries."""
    routes = routes_visible_to(user).prefetch_related("teams", "jobs").order_by("name")
    return [{**route_audit(route), "id": route.pk} for route in routes]


def delivery_rows(user, status: str | None = None, limit: int = 50) -> list[dict]:
    """The newest deliveries `user` may see (of one status), with their alert and route; one
    query."""
    rows = deliveries_visible_to(user).select_related("alert", "route")
    rows = rows.order_by("-created_at", "-id")
    if status:
        rows = rows.filter(status=status)
    return [
        {
            "id": row.pk,
            "created_at": row.created_at,
            "route": row.route.name,
            "alert_key": row.alert.key,
            "event": row.alert.event,
            "severity": row.alert.severity,
            "action": row.action,
            "status": row.status,
            "attempts": row.attempts,
            "response_status": row.response_status,
            "delivered_at": row.delivered_at,
            "next_attempt_at": row.next_attempt_at,
            "last_error": row.last_error,
        }
        for row in rows[:limit]
    ]


def delivery_counts(user, hours: float = 24.0) -> list[dict]:
    """Deliveries `user` may see queued in the last `hours` per route and status:
    {"route", "status", "n"}."""
    since = timezone.now() - timedelta(hours=hours)
    counted = (
        deliveries_visible_to(user, AlertDelivery.objects.filter(created_at__gte=since))
        .values("route__name", "status")
        .annotate(n=Count("id"))
        .order_by("route__name", "status")
    )
    return [{"route": r["route__name"], "status": r["status"], "n": r["n"]} for r in counted]
