"""Celery tasks for reports and alerts. Thin: take an id, call console.services.

None of them is acks_late: sending an email is not idempotent, and a redelivered message after a
worker crash would mail the same report twice. Only transient SMTP/network errors are retried, a
bounded number of times with exponential backoff; anything else fails the task at once.

`backstop.send_report` is what django-celery-beat runs for each ReportSubscription (its
PeriodicTask passes `{"subscription_id": id}`); the alert tasks are for the supervision code.
"""

from __future__ import annotations

import logging
import smtplib

from celery import shared_task

from console.models import Job, RecoveryEpisode, ReportSubscription
from console.services import alerts, reports
from infra import tasks

logger = logging.getLogger(__name__)

# Worth another try later: the mail server was unreachable, hung up or timed out. Authentication
# failures and refused recipients are not: retrying would fail the same way.
TRANSIENT_SMTP_ERRORS = (
    smtplib.SMTPConnectError,
    smtplib.SMTPServerDisconnected,
    ConnectionError,
    TimeoutError,
)

# No queue here: controller tasks default to `control` (web/celery.py).
EMAIL_TASK_OPTIONS = {
    "autoretry_for": TRANSIENT_SMTP_ERRORS,
    "max_retries": 4,
    "retry_backoff": 30,  # 30 s, 60 s, 120 s, 240 s (with jitter)
    "retry_backoff_max": 600,
    "retry_jitter": True,
    "time_limit": 180,
    "soft_time_limit": 150,
}


@shared_task(
    name=tasks.SEND_REPORT.name,
    # A report that could not start within an hour is dropped; the next scheduled one covers it.
    expires=tasks.SEND_REPORT.expires_s,
    **EMAIL_TASK_OPTIONS,
)
def send_report(subscription_id: int) -> str:
    """Send subscription `subscription_id`'s report now (skipped when gone or disabled)."""

    subscription = ReportSubscription.objects.filter(pk=subscription_id).first()
    if subscription is None or not subscription.enabled:
        logger.info("report %s skipped: subscription missing or disabled", subscription_id)
        return "skipped"
    reports.send_report(subscription)
    return "sent"


@shared_task(
    name=tasks.ALERT_RECOVERY.name, expires=tasks.ALERT_RECOVERY.expires_s, **EMAIL_TASK_OPTIONS
)
def alert_recovery(episode_id: int) -> int:
    """Check episode `episode_id` against every recovery-time alert; return emails sent."""

    episode = RecoveryEpisode.objects.select_related("job").filter(pk=episode_id).first()
    if episode is None:
        return 0
    return alerts.check_alerts_for_episode(episode)


@shared_task(
    name=tasks.ALERT_JOB_FAILED.name, expires=tasks.ALERT_JOB_FAILED.expires_s, **EMAIL_TASK_OPTIONS
)
def alert_job_failed(job_id: int) -> int:
    """Alert the subscriptions that ask for it that job `job_id` failed; return emails sent."""

    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    return alerts.alert_job_failed(job)


@shared_task(name=tasks.ALERT_KAFKA.name, expires=tasks.ALERT_KAFKA.expires_s, **EMAIL_TASK_OPTIONS)
def alert_kafka(job_id: int, kind: str, since: str, detail: dict) -> int:
    """Alert a Kafka condition of job `job_id` (console.services.alerts.alert_kafka); return
    emails sent."""

    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    return alerts.alert_kafka(job, kind, since, detail)


@shared_task(
    name=tasks.ALERT_RECONCILE_FAILING.name,
    expires=tasks.ALERT_RECONCILE_FAILING.expires_s,
    **EMAIL_TASK_OPTIONS,
)
def alert_reconcile_failing(job_id: int, since: float, failures: int, error: str) -> int:
    """Alert that the reconciles of job `job_id` keep failing
    (console.services.alerts.alert_reconcile_failing); return emails sent."""

    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    return alerts.alert_reconcile_failing(job, since, failures, error)
