"""What an alert looks like on each channel, and the rules of its delivery, without Django.

Pure functions over plain values, so they are unit-tested without a database and the worker
that sends (console.services.alert_routing) only adds the I/O:

- the events and severities routes choose from (`EVENTS`, `SEVERITIES`, `severity_at_least`);
- one request per channel: `webhook_request` (Backstop's JSON, signed with HMAC-SHA256 in the
  `X-Backstop-Signature` header), `slack_request` (Slack's incoming-webhook JSON),
  `pagerduty_request` (PagerDuty's Events API v2, trigger and resolve with a dedup key) and
  `email_message` (subject and text);
- the retry schedule of a delivery that failed (`retry_delay_s`, `MAX_ATTEMPTS`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

# Severities from least to most urgent; the names are PagerDuty's, so they pass through as-is.
SEVERITIES = ("info", "warning", "error", "critical")

# Every event a route can ask for, with the severity it is raised at and what it means.
EVENTS: dict[str, tuple[str, str]] = {
    "job-failed": ("critical", "a job failed for good (the controller gave up on it)"),
    "job-unprotected": (
        "error",
        "a stage of a protected operator ran without its standby longer than the policy's "
        "alert_unprotected_s",
    ),
    "output-stalled": (
        "error",
        "a job wrote no output for the policy's alert_no_output_s while input arrived",
    ),
    "restarts": (
        "warning",
        "a job's failures (restarts, promotions) reached the policy's alert_restarts_count within "
        "alert_restarts_window_s",
    ),
    "checkpoint-failing": ("error", "a stage's checkpoint (state commit) failed"),
    "checkpoint-slow": (
        "warning",
        "a stage's batches took longer than the policy's alert_checkpoint_duration_s",
    ),
    "kafka-lag": ("warning", "a Kafka job's lag stayed over the policy's kafka_lag_alert_records"),
    "kafka-source": ("error", "a Kafka job's source cannot read (broker down, topic missing)"),
    "recovery-slow": (
        "warning",
        "a recovery took longer than the policy's alert_recovery_over_s",
    ),
    "reconcile-failing": ("error", "the controller's reconciles of a job keep failing"),
}

# The header a webhook receiver checks: "sha256=<hex HMAC-SHA256 of the raw body>".
SIGNATURE_HEADER = "X-Backstop-Signature"
# When the request was signed (epoch seconds), also covered by the signature, so a receiver can
# refuse replays of an old request.
TIMESTAMP_HEADER = "X-Backstop-Timestamp"

TRIGGER = "trigger"
RESOLVE = "resolve"

# Retries: 1 s doubling up to 30 s between attempts, so a receiver that comes back is reached
# within 30 s, and 60 attempts (about half an hour of outage) before a delivery is given up.
RETRY_FIRST_DELAY_S = 1.0
RETRY_MAX_DELAY_S = 30.0
MAX_ATTEMPTS = 60


@dataclass(frozen=True)
class AlertFacts:
    """What every channel says about an alert: the route's channel adds only its framing."""

    key: str  # stable: the same condition of the same job is always the same key
    event: str
    severity: str
    action: str  # TRIGGER or RESOLVE
    summary: str
    source: str  # what the alert is about, e.g. "job wc (id 12)"
    details: dict
    opened_at: float  # epoch seconds
    resolved_at: float | None = None
    link: str = ""


@dataclass(frozen=True)
class HttpRequest:
    """One POST to a receiver."""

    url: str
    body: bytes
    headers: dict


def severity_at_least(severity: str, minimum: str) -> bool:
    """Whether `severity` is `minimum` or more urgent."""
    return SEVERITIES.index(severity) >= SEVERITIES.index(minimum)


def retry_delay_s(attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt (1, 2, 4, ... s, at most 30 s)."""
    return min(RETRY_MAX_DELAY_S, RETRY_FIRST_DELAY_S * 2.0 ** max(0, attempts - 1))


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The webhook signature header's value: HMAC-SHA256 over "<timestamp>." + body."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _json(payload: dict) -> bytes:
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


def webhook_payload(facts: AlertFacts) -> dict:
    """Backstop's own JSON: every fact of the alert under stable names."""
    return {
        "key": facts.key,
        "action": facts.action,
        "event": facts.event,
        "severity": facts.severity,
        "summary": facts.summary,
        "source": facts.source,
        "details": facts.details,
        "opened_at": facts.opened_at,
        "resolved_at": facts.resolved_at,
        "link": facts.link,
    }


def webhook_request(url: str, secret: str, facts: AlertFacts, now: float) -> HttpRequest:
    """The signed JSON POST of the generic webhook channel."""
    body = _json(webhook_payload(facts))
    timestamp = f"{int(now)}"
    headers = {
        "Content-Type": "application/json",
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }
    return HttpRequest(url, body, headers)


_SLACK_MARK = {"info": ":information_source:", "warning": ":warning:", "error": ":x:"}


def slack_request(url: str, facts: AlertFacts) -> HttpRequest:
    """Slack's incoming-webhook JSON: a fallback `text` and one section block of Markdown."""
    if facts.action == RESOLVE:
        headline = f":white_check_mark: Resolved: {facts.summary}"
    else:
        mark = _SLACK_MARK.get(facts.severity, ":rotating_light:")
        headline = f"{mark} [{facts.severity}] {facts.summary}"
    lines = [f"*{headline}*", f"{facts.event} on {facts.source} (key `{facts.key}`)"]
    if facts.link:
        lines.append(f"<{facts.link}|Open in Backstop>")
    payload = {
        "text": headline,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}],
    }
    return HttpRequest(url, _json(payload), {"Content-Type": "application/json"})


def pagerduty_request(url: str, routing_key: str, facts: AlertFacts) -> HttpRequest:
    """PagerDuty Events API v2: a trigger with the summary, source and severity, or a resolve;
    the alert's key is the dedup key, so PagerDuty folds repeats into one incident."""
    payload: dict = {
        "routing_key": routing_key,
        "event_action": facts.action,
        "dedup_key": facts.key,
    }
    if facts.action == TRIGGER:
        payload["payload"] = {
            "summary": facts.summary[:1024],  # PagerDuty's limit
            "source": facts.source,
            "severity": facts.severity,
            "component": facts.event,
            "custom_details": facts.details,
        }
        if facts.link:
            payload["links"] = [{"href": facts.link, "text": "Open in Backstop"}]
    return HttpRequest(url, _json(payload), {"Content-Type": "application/json"})


def email_message(facts: AlertFacts, subject_prefix: str = "") -> tuple[str, str]:
    """(subject, text body) of the email channel."""
    if facts.action == RESOLVE:
        subject = f"{subject_prefix}Resolved: {facts.summary}"
    else:
        subject = f"{subject_prefix}[{facts.severity}] {facts.summary}"
    lines = [
        facts.summary,
        "",
        f"Event: {facts.event} ({facts.severity})",
        f"About: {facts.source}",
        f"Key: {facts.key}",
    ]
    lines += [f"{name}: {value}" for name, value in sorted(facts.details.items())]
    if facts.link:
        lines += ["", facts.link]
    return subject[:200], "\n".join(lines) + "\n"
