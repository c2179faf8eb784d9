"""Retention: what the console keeps, and the purge that removes the rest.

What grows without end while jobs run, and how long it is kept (settings, web/settings/base.py):

- MetricSample rows: METRIC_RETENTION_HOURS (48). The bulk of the database: every progress record
  of a primary and every policy cycle write rows (docs/RELIABILITY.md, "Retention", has the rates).
- ControlDecision rows: DECISION_RETENTION_DAYS (30).
- RecoveryEpisode rows that are closed (their figures final, `watched_s` set):
  EPISODE_RETENTION_DAYS (30), by when they were detected. Open episodes are never purged.
  The audits count each lost or duplicated result once over a job's episodes
  (recovery.audit_closed_episodes subtracts what the job's audited episodes already hold), so
  the audited episodes of a job that go are folded into one that stays: the job's newest
  audited episode among the old ones carries their lost and duplicated results (its notes say
  so), and the sums over the job's episodes, hence the next audit and the /metrics counters of
  lost and duplicated results, do not change.
- FaultInjection rows no longer pending: FAULT_RETENTION_DAYS (30), unless an episode that is kept
  still names the fault.
- Alerts resolved before DECISION_RETENTION_DAYS (30) ago, with their deliveries; and the
  deliveries of alerts still open that ended (delivered or given up) before then. Open alerts
  and pending deliveries are never purged.
- The data plane's progress streams in Redis (`spark_runtime.keys.progress`): capped at
  PROGRESS_MAXLEN entries each by the stages, and trimmed here to PROGRESS_RETENTION_HOURS
  (48) by entry id (a stream id is the time it was added); the empty stream of a job that no
  longer runs is deleted, with its ingest cursor.
- AuditEvent rows (the audit log): AUDIT_RETENTION_DAYS (365), by when they happened.
- The run keys of a job that no longer runs (its stages' entries, exits and log tails, where its
  generator ran, its replicas' Kafka lag: `run_keys`), once none of its replicas runs.

Rows go in batches of RETENTION_BATCH_ROWS, each its own short transaction (a purge of millions
of rows never holds a lock for minutes), and a run stops starting batches after
RETENTION_MAX_SECONDS: what is left goes in the next run (the beat task runs hourly). The kinds
with few rows go first, the metric samples last with the time that is left.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, QuerySet, Sum
from django.utils import timezone

from console.models import (
    Alert,
    AlertDelivery,
    AuditEvent,
    ControlDecision,
    FaultInjection,
    Job,
    MetricSample,
    RecoveryEpisode,
    Replica,
)
from infra import keys as control_keys
from spark_runtime import keys as data_keys

logger = logging.getLogger(__name__)

CARRIED = re.compile(r"\s*\[retention: also the audit of (\d+) purged older episodes\]$")


@dataclass(frozen=True)
class Retention:
    """How long each kind of record is kept, and how a purge runs."""

    metric_hours: float = 48
    decision_days: float = 30
    episode_days: float = 30
    fault_days: float = 30
    progress_hours: float = 48
    audit_days: float = 365
    batch_rows: int = 10_000
    max_seconds: float = 300

    @classmethod
    def from_settings(cls) -> Retention:
        return cls(
            metric_hours=settings.METRIC_RETENTION_HOURS,
            decision_days=settings.DECISION_RETENTION_DAYS,
            episode_days=settings.EPISODE_RETENTION_DAYS,
            fault_days=settings.FAULT_RETENTION_DAYS,
            progress_hours=settings.PROGRESS_RETENTION_HOURS,
            audit_days=settings.AUDIT_RETENTION_DAYS,
            batch_rows=settings.RETENTION_BATCH_ROWS,
            max_seconds=settings.RETENTION_MAX_SECONDS,
        )


def delete_in_batches(rows: QuerySet, batch_rows: int, deadline: float) -> int:
    """Delete `rows` `batch_rows` at a time, each batch in its own transaction, until none are
    left or `deadline` (time.monotonic()) has passed; returns how many rows went."""
    model = rows.model
    deleted = 0
    while time.monotonic() < deadline:
        ids = list(rows.order_by().values_list("pk", flat=True)[:batch_rows])
        if not ids:
            break
        with transaction.atomic():
            _, by_model = model.objects.filter(pk__in=ids).delete()
        deleted += by_model.get(model._meta.label, 0)
        if len(ids) < batch_rows:
            break
    return deleted


def purge_metrics(hours: float, batch_rows: int, deadline: float, now=None) -> int:
    cutoff = (now or timezone.now()) - timedelta(hours=hours)
    return delete_in_batches(MetricSample.objects.filter(at__lt=cutoff), batch_rows, deadline)


def purge_decisions(days: float, batch_rows: int, deadline: float, now=None) -> int:
    cutoff = (now or timezone.now()) - timedelta(days=days)
    return delete_in_batches(ControlDecision.objects.filter(at__lt=cutoff), batch_rows, deadline)


def purge_audit_events(days: float, batch_rows: int, deadline: float, now=None) -> int:
    """Audit log events older than the cutoff."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    return delete_in_batches(AuditEvent.objects.filter(at__lt=cutoff), batch_rows, deadline)


def purge_alerts(days: float, batch_rows: int, deadline: float, now=None) -> int:
    """Alerts resolved before the cutoff (their deliveries go with them), then the ended
    deliveries of alerts kept; returns how many alerts, and deliveries of alerts kept, went."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    old_alerts = Alert.objects.filter(state=Alert.State.RESOLVED, resolved_at__lt=cutoff)
    old_deliveries = AlertDelivery.objects.filter(created_at__lt=cutoff).exclude(
        status=AlertDelivery.Status.PENDING
    )
    return delete_in_batches(old_alerts, batch_rows, deadline) + delete_in_batches(
        old_deliveries, batch_rows, deadline
    )


def _fold_audits(job_id: int, carrier_pk: int, old_audited: QuerySet) -> int:
    """Delete the job's old audited episodes but the carrier, adding their lost and duplicated
    results to it, in one transaction; returns how many went."""
    with transaction.atomic():
        carrier = RecoveryEpisode.objects.select_for_update().get(pk=carrier_pk)
        others = old_audited.filter(job_id=job_id).exclude(pk=carrier_pk)
        sums = others.aggregate(n=Count("id"), lost=Sum("lost"), duplicates=Sum("duplicates"))
        if not sums["n"]:
            return 0
        # Episodes counted: the ones going, and those a former carrier among them held.
        count = sums["n"] + sum(
            int(match.group(1))
            for notes in others.values_list("notes", flat=True)
            if (match := CARRIED.search(notes))
        )
        carried = CARRIED.search(carrier.notes)
        count += int(carried.group(1)) if carried else 0
        carrier.lost = (carrier.lost or 0) + (sums["lost"] or 0)
        carrier.duplicates = (carrier.duplicates or 0) + (sums["duplicates"] or 0)
        base = CARRIED.sub("", carrier.notes)
        carrier.notes = f"{base} [retention: also the audit of {count} purged older episodes]"
        carrier.notes = carrier.notes.strip()
        carrier.save(update_fields=["lost", "duplicates", "notes"])
        _, by_model = others.delete()
    return by_model.get(RecoveryEpisode._meta.label, 0)


def purge_episodes(days: float, batch_rows: int, deadline: float, now=None) -> int:
    """Closed episodes detected before the cutoff; audited ones are folded per job (see the
    module docstring), unaudited ones simply go."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    old_closed = RecoveryEpisode.objects.filter(watched_s__isnull=False, detected_at__lt=cutoff)
    deleted = delete_in_batches(old_closed.filter(lost__isnull=True), batch_rows, deadline)
    old_audited = old_closed.filter(lost__isnull=False)
    carriers = (
        old_audited.order_by()
        .values("job_id")
        .annotate(carrier=Max("pk"), n=Count("id"))
        .filter(n__gt=1)
    )
    for row in carriers:
        if time.monotonic() >= deadline:
            break
        deleted += _fold_audits(row["job_id"], row["carrier"], old_audited)
    return deleted


def purge_faults(days: float, batch_rows: int, deadline: float, now=None) -> int:
    """Faults asked for before the cutoff that are no longer pending and that no kept episode
    names."""
    cutoff = (now or timezone.now()) - timedelta(days=days)
    old = FaultInjection.objects.filter(requested_at__lt=cutoff, episodes__isnull=True).exclude(
        outcome=FaultInjection.Outcome.PENDING
    )
    return delete_in_batches(old, batch_rows, deadline)


def trim_progress(client, hours: float, now_s: float | None = None) -> int:
    """Trim every job's progress stream to the last `hours` (by entry id, exactly) and delete
    the empty streams of jobs that no longer run; returns how many entries went."""
    min_id = f"{int(((now_s or time.time()) - hours * 3600) * 1000)}-0"
    jobs = list(Job.objects.values_list("key", "status"))
    if not jobs:
        return 0
    with client.pipeline(transaction=False) as pipe:
        for key, _ in jobs:
            pipe.xtrim(data_keys.progress(key), minid=min_id, approximate=False)
            pipe.xlen(data_keys.progress(key))
        replies = pipe.execute()
    trimmed, lengths = replies[0::2], replies[1::2]
    ended = [
        data_keys.progress(key)
        for (key, status), length in zip(jobs, lengths, strict=True)
        if length == 0 and status not in Job.LIVE_STATUSES
    ]
    if ended:
        # The ingest cursor goes with its stream: a restarted job's new stream is read from its
        # start, so nothing is stored twice.
        client.delete(*ended, *(control_keys.ingest_cursor(stream) for stream in ended))
    return sum(trimmed)


def run_keys(job_key: str) -> list[str]:
    """The Redis keys that describe one run of a job and nothing after it: the stages' entries,
    their exits and log tails, where its generator ran, and how far its replicas were behind
    their Kafka topic. A restart starts a new run, which writes them again (a Kafka job's plan
    log and source and sink stay: a restart resumes from them)."""
    return [
        data_keys.replicas(job_key),
        data_keys.kafka_lag(job_key),
        control_keys.exits(job_key),
        control_keys.exit_tails(job_key),
        control_keys.generator_node(job_key),
    ]


def forget_ended_runs(client) -> int:
    """Delete the run keys of jobs that are no longer live and have no replica left running;
    returns how many keys went. The data a stopped job keeps on purpose (its input, results,
    fencing epochs, watermarks: it can be restarted and audited) stays, and so does its cursor
    on the agents' events stream, so a restart does not read its old runs' events again."""
    running = Replica.objects.exclude(state__in=(Replica.State.STOPPED, Replica.State.FAILED))
    ended = Job.objects.exclude(status__in=Job.LIVE_STATUSES).exclude(
        pk__in=running.values("job_id")
    )
    doomed = [key for job_key in ended.values_list("key", flat=True) for key in run_keys(job_key)]
    removed = 0
    for start in range(0, len(doomed), 500):
        removed += client.delete(*doomed[start : start + 500])
    return removed


def purge_old_records(client=None, retention: Retention | None = None, now=None) -> dict:
    """One purge run: every kind of record past its retention, the small kinds first; returns
    how many of each went (see the module docstring)."""
    retention = retention or Retention.from_settings()
    deadline = time.monotonic() + retention.max_seconds
    batch = retention.batch_rows
    purged = {
        "decisions": purge_decisions(retention.decision_days, batch, deadline, now),
        "episodes": purge_episodes(retention.episode_days, batch, deadline, now),
        "faults": purge_faults(retention.fault_days, batch, deadline, now),
        "audit_events": purge_audit_events(retention.audit_days, batch, deadline, now),
        "alerts": purge_alerts(retention.decision_days, batch, deadline, now),
        "progress_entries": (
            trim_progress(client, retention.progress_hours, now.timestamp() if now else None)
            if client is not None
            else 0
        ),
        "metrics": purge_metrics(retention.metric_hours, batch, deadline, now),
        "run_keys": forget_ended_runs(client) if client is not None else 0,
    }
    purged["finished"] = time.monotonic() < deadline
    logger.info("retention purge: %s", purged)
    return purged
