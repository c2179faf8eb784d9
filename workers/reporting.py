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


@shared_task(**tasks.SEND_REPORT.options(autoretry_for=TRANSIENT_SMTP_ERRORS))
def send_report(subscription_id: int) -> str:
    """Send subscription `subscription_id`'s report now (skipped when gone or disabled)."""

    subscription = ReportSubscription.objects.filter(pk=subscription_id).first()
    if subscription is None or not subscription.enabled:
        logger.info("report %s skipped: subscription missing or disabled", subscription_id)
        return "skipped"
    reports.send_report(subscription)
    return "sent"


@shared_task(**tasks.ALERT_RECOVERY.options(autoretry_for=TRANSIENT_SMTP_ERRORS))
def alert_recovery(episode_id: int) -> int:
    """Check episode `episode_id` against every recovery-time alert; return emails sent."""

    episode = RecoveryEpisode.objects.select_related("job").filter(pk=episode_id).first()
    if episode is None:
        return 0
    return alerts.check_alerts_for_episode(episode)


@shared_task(**tasks.ALERT_JOB_FAILED.options(autoretry_for=TRANSIENT_SMTP_ERRORS))
def alert_job_failed(job_id: int) -> int:
    """Alert the subscriptions that ask for it that job `job_id` failed; return emails sent."""

    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    return alerts.alert_job_failed(job)


@shared_task(**tasks.ALERT_KAFKA.options(autoretry_for=TRANSIENT_SMTP_ERRORS))
def alert_kafka(job_id: int, kind: str, since: str, detail: dict) -> int:
    """Alert a Kafka condition of job `job_id` (console.services.alerts.alert_kafka); return
    emails sent."""

    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    return alerts.alert_kafka(job, kind, since, detail)


@shared_task(**tasks.ALERT_RECONCILE_FAILING.options(autoretry_for=TRANSIENT_SMTP_ERRORS))
def alert_reconcile_failing(job_id: int, since: float, failures: int, error: str) -> int:
    """Alert that the reconciles of job `job_id` keep failing
    (console.services.alerts.alert_reconcile_failing); return emails sent."""

    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return 0
    return alerts.alert_reconcile_failing(job, since, failures, error)
