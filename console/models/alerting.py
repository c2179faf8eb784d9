"""Alert routing: routes (who hears of what, on which channel), alerts (one row per condition,
under a stable key) and deliveries (one send of one alert's trigger or resolve to one route,
with its attempts and outcome).

Written by console.services.alert_routing (raise, clear, deliver); the channels' payloads are
console.alerting_payloads'. Imports jobs and teams only.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models
from django.utils import timezone

from console.alerting_payloads import EVENTS, RESOLVE, SEVERITIES, TRIGGER
from console.models.jobs import Job
from console.models.reports import validate_recipients
from console.models.teams import Team

SEVERITY_CHOICES = [(name, name) for name in SEVERITIES]
EVENT_CHOICES = [(name, name) for name in EVENTS]


def route_target_error(channel: str, target: str) -> str | None:
    """Why `target` cannot be a `channel` route's target (None: it can): an email route takes
    comma-separated addresses, the others an http(s) URL."""
    if channel == "email":
        try:
            validate_recipients(target)
        except ValidationError as exc:
            return exc.messages[0].replace("recipients: ", "")
        return None
    try:
        URLValidator(schemes=["http", "https"])(target)
    except ValidationError:
        return f"a {channel} route needs an http(s) URL, not {target!r}"
    return None


class AlertRoute(models.Model):
    """Send the chosen `events` (empty: all) of the chosen jobs or teams (neither: every job),
    from `min_severity` up, to one channel's `target`.

    `target` is an email address list (comma-separated) for `email`, else the receiver's URL.
    `secret` signs the webhook channel's requests (HMAC-SHA256) and is the routing key of the
    PagerDuty channel; one is generated when none is given.
    """

    class Channel(models.TextChoices):
        EMAIL = "email"
        WEBHOOK = "webhook"
        SLACK = "slack"
        PAGERDUTY = "pagerduty"

    name = models.CharField(max_length=100, unique=True)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    target = models.CharField(max_length=500)
    events = models.JSONField(default=list, blank=True, help_text="Event names; empty: all.")
    min_severity = models.CharField(max_length=16, choices=SEVERITY_CHOICES, default="warning")
    teams = models.ManyToManyField(Team, blank=True, related_name="alert_routes")
    jobs = models.ManyToManyField(Job, blank=True, related_name="alert_routes")
    enabled = models.BooleanField(default=True)
    secret = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.channel})"

    def clean(self):
        """The target fits the channel; every event is known (the admin's form runs this)."""
        errors = {}
        problem = route_target_error(self.channel, self.target)
        if problem:
            errors["target"] = problem
        unknown = sorted(set(self.events or []) - set(EVENTS))
        if not isinstance(self.events, list):
            errors["events"] = "a list of event names"
        elif unknown:
            errors["events"] = f"unknown events {unknown}; known: {sorted(EVENTS)}"
        if errors:
            raise ValidationError(errors)


class Alert(models.Model):
    """One condition of one job (or of Backstop itself), under a key that names the condition,
    not the check that saw it: repeats of the check touch `last_seen_at` and `seen` only."""

    class State(models.TextChoices):
        OPEN = "open"
        RESOLVED = "resolved"

    key = models.CharField(max_length=200, unique=True)
    event = models.CharField(max_length=40, choices=EVENT_CHOICES)
    severity = models.CharField(max_length=16, choices=SEVERITY_CHOICES)
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    opened_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    seen = models.PositiveIntegerField(default=1, help_text="Checks that found it, this opening.")
    summary = models.CharField(max_length=300)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-opened_at"]

    def __str__(self):
        return f"{self.key} ({self.state})"


class AlertDelivery(models.Model):
    """One send of an alert's trigger or resolve to one route, tried until it is delivered or
    given up (`failed`); `next_attempt_at` is when a worker may try it next."""

    class Action(models.TextChoices):
        TRIGGER = TRIGGER
        RESOLVE = RESOLVE

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    route = models.ForeignKey(AlertRoute, on_delete=models.CASCADE, related_name="deliveries")
    action = models.CharField(max_length=16, choices=Action.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    next_attempt_at = models.DateTimeField(default=timezone.now, db_index=True)
    last_error = models.CharField(max_length=500, blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "alert deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_due")]

    def __str__(self):
        return f"{self.action} {self.alert.key} -> {self.route.name}: {self.status}"
