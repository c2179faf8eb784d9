"""Alert emails: a recovery that takes too long, a job that failed for good, a Kafka source that
cannot read, a Kafka job's lag over the policy's bound, a job whose supervision keeps failing.

Recipients are the enabled ReportSubscriptions whose scope covers the job and that ask for the
alert (`alert_recovery_over_s` set, or `alert_on_job_failure`); the Kafka alerts go to those that
ask for either. Each event is alerted at most once per subscription: a SentAlert row is written
in the same transaction as the email is sent, so a failed send leaves no row and a later call
tries again.

Call points for the supervision code (or their Celery wrappers in workers/reporting.py, so a slow
mail server never delays a supervision cycle):

- `check_alerts_for_episode(episode)` every cycle while an episode is open, and once when it is
  closed: an open episode alerts as soon as its elapsed time passes the threshold, a closed one
  when its `recovery_time_s` does.
- `alert_job_failed(job)` right after `job.mark_failed(...)` when the controller gives up.
- `alert_kafka(job, kind, since, detail)` every policy cycle while a Kafka condition holds
  (console.services.control.record.watch_kafka): the event is the condition since `since`.
- `alert_reconcile_failing(job, since, failures, error)` once a job's reconciles have failed
  RECONCILE_ALERT_FAILURES times in a row (console.services.control.record): the event is the
  streak of failures since `since`.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.mail import EmailMessage
from django.db import transaction
from django.db.models import Q
from django.template.loader import render_to_string
from django.utils import timezone

from console.clock import utc
from console.models import Job, RecoveryEpisode, ReportSubscription, SentAlert
from console.services.kafka_status import LAG, SOURCE

logger = logging.getLogger(__name__)


def subscriptions_for(job: Job):
    """Enabled subscriptions whose scope includes `job`."""
    return (
        ReportSubscription.objects.filter(enabled=True)
        .filter(
            Q(scope=ReportSubscription.Scope.ALL)
            | Q(scope=ReportSubscription.Scope.SELECTED, jobs=job)
            | Q(scope=ReportSubscription.Scope.TEAM, team__isnull=False, team_id=job.team_id)
        )
        .distinct()
    )


def recovery_elapsed_s(episode: RecoveryEpisode, now=None) -> float:
    """The recovery time of a recovered episode, how long one that never got back to normal
    was watched, or how long an open one has been going on."""
    if episode.recovery_time_s is not None:
        return episode.recovery_time_s
    if episode.watched_s is not None:
        return episode.watched_s
    return ((now or timezone.now()) - episode.detected_at).total_seconds()


def check_alerts_for_episode(episode: RecoveryEpisode, *, now=None) -> int:
    """Alert every subscription whose recovery threshold `episode` exceeds; return emails sent."""
    elapsed = recovery_elapsed_s(episode, now)
    sent = 0
    candidates = subscriptions_for(episode.job).filter(alert_recovery_over_s__isnull=False)
    for subscription in candidates:
        if elapsed <= subscription.alert_recovery_over_s:
            continue
        if episode.recovery_time_s is not None:
            state = "took"
        elif episode.watched_s is not None:
            state = "not back to normal within"
        else:
            state = "still recovering after"
        subject = (
            f"{settings.EMAIL_SUBJECT_PREFIX}Slow recovery: {episode.job.name} "
            f"{state} {elapsed:.1f} s (limit {subscription.alert_recovery_over_s:g} s)"
        )
        facts = [
            ("Job", f"{episode.job.name} (id {episode.job_id}, {episode.strategy})"),
            ("Stage", episode.stage or "-"),
            ("Action", episode.get_action_display()),
            ("Detected at", f"{episode.detected_at:%Y-%m-%d %H:%M:%S} UTC"),
            ("Recovered at", _time_or(episode.recovered_at, "not yet")),
            ("Recovery time", f"{elapsed:.1f} s"),
            ("Limit", f"{subscription.alert_recovery_over_s:g} s"),
        ]
        link = f"{settings.CONSOLE_BASE_URL}/api/jobs/{episode.job_id}/recoveries/"
        if _send_once(subscription, f"recovery:{episode.pk}", subject, facts, link):
            sent += 1
    return sent


def alert_job_failed(job: Job) -> int:
    """Alert the subscriptions that ask for job failures that `job` failed; return emails sent."""
    if job.status != Job.Status.FAILED:
        return 0
    # The failure time is in the key: a job restarted and failed again is a new event.
    failed_at = job.stopped_at.isoformat() if job.stopped_at else ""
    subject = f"{settings.EMAIL_SUBJECT_PREFIX}Job failed: {job.name}"
    facts = [
        ("Job", f"{job.name} (id {job.pk}, {job.topology}, {job.strategy})"),
        ("Failed at", _time_or(job.stopped_at, "unknown")),
        ("Reason", job.status_reason or "-"),
    ]
    link = f"{settings.CONSOLE_BASE_URL}/api/jobs/{job.pk}/"
    return _send_to_each(
        subscriptions_for(job).filter(alert_on_job_failure=True),
        f"job-failed:{job.pk}:{failed_at}",
        subject,
        facts,
        link,
    )


def alerting_subscriptions(job: Job):
    """The subscriptions that ask for any alert about `job`: they hear of its conditions that
    are neither a slow recovery nor a failure (Kafka, a supervision that keeps failing)."""
    return subscriptions_for(job).filter(
        Q(alert_on_job_failure=True) | Q(alert_recovery_over_s__isnull=False)
    )


def kafka_subscriptions(job: Job):
    """The subscriptions that hear of `job`'s Kafka conditions: those that ask for any alert."""
    return alerting_subscriptions(job)


def alert_kafka(job: Job, kind: str, since: str, detail: dict) -> int:
    """Alert that `job`'s Kafka source cannot read (`kind` SOURCE, `detail` {"cause"}) or that
    its primaries' lag is over the policy's bound (LAG, {"total", "limit", "stages"}), a
    condition the controller has seen since `since` (epoch seconds, as it stored them: the same
    condition is alerted once); return emails sent."""
    if kind not in (SOURCE, LAG):
        return 0
    started = _time_or(utc(since), "unknown")
    topic = (job.source or {}).get("topic", "-")
    facts = [("Job", f"{job.name} (id {job.pk}, {job.topology}, {job.strategy})"), ("Topic", topic)]
    if kind == SOURCE:
        subject = f"{settings.EMAIL_SUBJECT_PREFIX}Kafka source not reading: {job.name}: "
        subject += detail["cause"]
        facts += [("Cause", detail["cause"]), ("Since", started)]
    else:
        subject = (
            f"{settings.EMAIL_SUBJECT_PREFIX}Kafka lag: {job.name} is {detail['total']:,} "
            f"records behind {topic} (limit {detail['limit']:,})"
        )
        facts += [
            ("Lag", f"{detail['total']:,} records (all partitions, the stages' primaries)"),
            ("Limit", f"{detail['limit']:,} records (policy kafka_lag_alert_records)"),
            ("Over the limit since", started),
        ]
        facts += [(f"Stage {stage}", lag) for stage, lag in detail.get("stages", [])]
    link = f"{settings.CONSOLE_BASE_URL}/console/jobs/{job.pk}/"
    return _send_to_each(
        kafka_subscriptions(job), f"kafka-{kind}:{job.pk}:{since}", subject, facts, link
    )


def alert_reconcile_failing(job: Job, since: float, failures: int, error: str) -> int:
    """Alert that the controller's reconciles of `job` have failed `failures` times in a row
    since `since` (epoch seconds: the streak is alerted once), the last with `error`; the job
    is retried with a growing delay meanwhile (console.services.fleet). Returns emails sent."""
    started = _time_or(utc(since), "unknown")
    subject = (
        f"{settings.EMAIL_SUBJECT_PREFIX}Supervision failing: {job.name}: "
        f"{failures} reconciles in a row failed"
    )
    facts = [
        ("Job", f"{job.name} (id {job.pk}, {job.topology}, {job.strategy})"),
        ("Failing since", started),
        ("Failures in a row", str(failures)),
        ("Last error", error or "-"),
    ]
    link = f"{settings.CONSOLE_BASE_URL}/console/jobs/{job.pk}/"
    return _send_to_each(
        alerting_subscriptions(job), f"reconcile:{job.pk}:{since}", subject, facts, link
    )


def _time_or(value, fallback: str) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S} UTC" if value else fallback


def _send_to_each(subscriptions, key: str, subject: str, facts, link) -> int:
    """`_send_once` to every subscription; returns how many emails went out."""
    return sum(_send_once(s, key, subject, facts, link) for s in subscriptions)


def _send_once(subscription: ReportSubscription, key: str, subject: str, facts, link) -> bool:
    """Send unless this subscription already got the alert `key`; True when it was sent now."""
    subject = subject[:200]
    with transaction.atomic():
        _, created = SentAlert.objects.get_or_create(
            subscription=subscription, key=key, defaults={"subject": subject}
        )
        if not created:
            return False
        body = render_to_string(
            "email/alert.txt",
            {
                "headline": subject.removeprefix(settings.EMAIL_SUBJECT_PREFIX),
                "facts": facts,
                "link": link,
                "subscription": subscription,
            },
        )
        # Raising here rolls the SentAlert row back, so the next call tries again.
        EmailMessage(
            subject, body, settings.DEFAULT_FROM_EMAIL, subscription.recipient_list()
        ).send(fail_silently=False)
    logger.info("alert %s sent to subscription %r", key, subscription.name)
    return True
