"""Measuring a job's recovery episodes live, from what the job actually emitted.

The data plane publishes one progress record per micro-batch of each replica; the controller
calls `measure_open_episodes` every policy cycle. The measurement itself is
`console.policy.recovery.measure_faults`, the same function the benchmark judges its runs with:
an episode closes (gets `watched_s`) once its figures are final, and they are then what the
benchmark would compute for the same fault with the same settings. Once episodes close, the
job's output is audited against ground truth (`audit_closed_episodes`, a Celery task).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta

import redis
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from console.clock import utc
from console.models import ControlDecision, Job, Operator, RecoveryEpisode, RegisteredTopology
from console.policy import recovery_phases, truth
from console.policy.config import PolicyConfig
from console.policy.recovery import (
    SAME_FAULT_S,
    FaultMeasurement,
    RecoverySettings,
    group_fault_times,
    measure_app_faults,
    measure_faults,
)
from console.services import output_audit
from infra import tasks
from infra.child import ChildTimedOut
from spark_runtime import external_io, kafka_audit
from spark_runtime import keys as data_keys
from spark_runtime.jobdef import is_registered_ident, registered_app
from spark_runtime.progress import read_progress

# A fault not back to normal this long after is given up on ("not back to normal before ...").
GIVE_UP_AFTER_S = 600.0
PROGRESS_READ_LIMIT = 20_000
# Progress records reach Redis a moment after their batch ends: the last seconds before now are
# not judged yet, so that a record still in flight is not taken for a gap in the output.
PUBLISH_LAG_S = 2.0


def judged_until(config: PolicyConfig) -> float:
    """How many seconds before now the output is judged: records in flight, and a fault that
    happened meanwhile must be known (found within a heartbeat timeout) before a recovery across
    it can be confirmed; else the live figure could differ from the one after the run."""
    return PUBLISH_LAG_S + config.heartbeat_timeout_s + 1.0


logger = logging.getLogger(__name__)


def recovery_settings(config: PolicyConfig) -> RecoverySettings:
    """The policy's settings for judging a fault."""
    return RecoverySettings(
        band=config.recovery_band,
        stable_window_s=config.recovery_stable_window_s,
        reference_window_s=config.reference_window_s,
        warmup_s=config.warmup_s,
    )


def fault_time(episode: RecoveryEpisode, config: PolicyConfig) -> datetime:
    """When the fault happened: the injection time, else detection minus the heartbeat timeout."""
    if episode.fault is not None and episode.fault.injected_at is not None:
        return episode.fault.injected_at
    return episode.detected_at - timedelta(seconds=config.heartbeat_timeout_s)


def input_started_at(client, job_key: str) -> float | None:
    """When the job's first input entry was written (epoch s, from its stream id; for a Kafka
    input, when its first records were planned); None before any input."""
    if external_io.load(client, job_key).source is not None:
        planned_ms = kafka_audit.first_plan_ms(client, job_key)
        return None if planned_ms is None else planned_ms / 1000.0
    first = client.xrange(data_keys.input_stream(job_key), count=1)
    if not first:
        return None
    first_id = first[0][0]
    first_id = first_id.decode() if isinstance(first_id, bytes) else first_id
    return int(first_id.split("-")[0]) / 1000.0


def audit_output(job: Job, client) -> truth.Comparison | None:
    """Lost and duplicated results in the job's output so far, against ground truth computed in
    plain Python from its input (console/policy/truth.py, "auditing a running job's output"),
    in a child process (console/services/output_audit.py); None for a topology without ground
    truth or an input too long to audit."""
    if not has_ground_truth(job):
        return None
    return output_audit.audit_in_child(
        output_audit.AuditRequest(
            job_key=job.key,
            topology=job.topology,
            stages=dict(job.operators.values_list("name", "stage")),
            redis=output_audit.RedisAddress.of(client),
        )
    )


def has_ground_truth(job: Job) -> bool:
    """True when the job's output can be audited: wordcount, topn, or a user job whose
    registered version ships a reference function."""
    if job.topology in truth.CHECKED_TOPOLOGIES:
        return True
    if not is_registered_ident(job.topology):
        return False
    name, _, number = job.topology.partition("@")
    version = RegisteredTopology.objects.filter(name=name, version=int(number)).first()
    return version is not None and bool(version.shape.get("has_reference"))


def audit_closed_episodes(job: Job, client) -> int:
    """Give the job's closed, not yet audited episodes their lost and duplicated results; returns
    how many. Idempotent: an audited episode is left alone.

    The audit covers the job's whole output so far; an episode records what it adds to the
    audits already recorded on the job's earlier episodes (so sums over episodes count each
    result once), the first of several closing together takes it all.
    """
    with transaction.atomic():
        pending = list(
            job.recoveries.select_for_update()
            .filter(watched_s__isnull=False, lost__isnull=True)
            .order_by("detected_at", "pk")
        )
        if not pending:
            return 0
        try:
            audit = audit_output(job, client)
        except (redis.RedisError, ValueError, KeyError, ChildTimedOut) as exc:
            # Never fatal: the episodes keep their measurement, without an audit.
            logger.warning("job %s: output audit failed: %s", job.key, exc)
            return 0
        if audit is None:
            return 0
        counted = job.recoveries.filter(lost__isnull=False).aggregate(
            lost=Sum("lost"), duplicates=Sum("duplicates")
        )
        lost = max(0, audit.lost - (counted["lost"] or 0))
        duplicates = max(0, audit.duplicates - (counted["duplicates"] or 0))
        for episode in pending:
            episode.lost, episode.duplicates = lost, duplicates
            episode.notes += (
                f"; output audited after it: {audit.lost} lost and {audit.duplicates} duplicated "
                f"of {audit.cells} results in the job so far ({lost} and {duplicates} new)"
            )
            episode.save(update_fields=["lost", "duplicates", "notes"])
            lost = duplicates = 0
        return len(pending)


def record_measurement(episode: RecoveryEpisode, measured: FaultMeasurement) -> None:
    """Store the final figures of the episode's fault (several episodes may share one fault)."""
    recovered = measured.recovered_at
    episode.downtime_s = measured.downtime_s
    episode.recovery_time_s = measured.recovery_time_s
    episode.recovered_at = None if recovered is None else utc(recovered)
    episode.peak_p99_ms = measured.peak_p99_ms
    episode.watched_s = measured.watched_s
    if measured.reference is not None:
        episode.reference_from, episode.reference_to = map(utc, measured.reference)
    episode.notes = f"{episode.notes}; {measured.note}" if episode.notes else measured.note
    episode.save(
        update_fields=[
            "downtime_s", "recovery_time_s", "recovered_at", "peak_p99_ms", "watched_s",
            "reference_from", "reference_to", "notes",
        ]
    )  # fmt: skip


def record_phases(
    episode: RecoveryEpisode, client, fault_at: float, output_times, closing: bool = False
) -> None:
    """Complete the episode's phase marks (console/policy/recovery_phases.py): the fault, what
    the replica that took over reported in its entry, and the first output after them (once
    that replica caught up, or when the episode closes without it saying so). Saved only when
    a mark was added; marks already taken stay."""
    marks = dict(episode.phases)
    marks.setdefault("fault", fault_at)
    taker = marks.get("replica")
    if taker:
        raw = client.hget(data_keys.replicas(episode.job.key), taker)
        if raw:
            promoted = episode.action == RecoveryEpisode.Action.PROMOTE
            since = marks.get("commanded") or marks.get("detected") or fault_at
            reported = recovery_phases.stage_marks(json.loads(raw), promoted, since)
            marks.update({k: v for k, v in reported.items() if k not in marks})
    if "first_output" not in marks:
        since = recovery_phases.last_mark(marks)
        first = recovery_phases.first_output_after(output_times, since or fault_at)
        if first is not None and ("caught_up" in marks or not taker or closing):
            marks["first_output"] = first
    if marks != episode.phases:
        episode.phases = marks
        episode.save(update_fields=["phases"])


def stored_measurement(episode: RecoveryEpisode, fault_at: float) -> FaultMeasurement:
    """A closed episode's figures as the measurement that produced them (what the next fault's
    downtime and reference depend on)."""
    reference = None
    if episode.reference_from is not None and episode.reference_to is not None:
        reference = (episode.reference_from.timestamp(), episode.reference_to.timestamp())
    return FaultMeasurement(
        fault_at=fault_at,
        downtime_s=episode.downtime_s,
        recovery_time_s=episode.recovery_time_s,
        recovered_at=None if episode.recovered_at is None else episode.recovered_at.timestamp(),
        peak_p99_ms=episode.peak_p99_ms,
        note=episode.notes,
        watched_s=episode.watched_s,
        final=True,
        reference=reference,
    )


def measure_open_episodes(job: Job, client, config: PolicyConfig, now: float | None = None) -> int:
    """Close every episode of the job whose figures are final; returns how many closed.

    The faults of the open episodes are measured in order after the newest closed fault before
    them (kept as stored: its progress may have been trimmed since), on output up to
    `judged_until` before `now`. A job that is no longer live is watched no further. Closed
    episodes are then audited (a Celery task: it reads the job's whole input).
    """
    open_episodes = list(job.recoveries.filter(watched_s__isnull=True).select_related("fault"))
    if not open_episodes:
        return 0
    now = timezone.now().timestamp() if now is None else now
    faults = group_fault_times(fault_time(e, config).timestamp() for e in open_episodes)
    previous = None
    closed_before = [
        (fault_time(e, config).timestamp(), e)
        for e in job.recoveries.filter(
            watched_s__isnull=False,
            detected_at__lte=utc(faults[0]) + timedelta(seconds=config.heartbeat_timeout_s),
        )
        .select_related("fault")
        .order_by("-detected_at")[:5]
    ]
    closed_before = [(at, e) for at, e in closed_before if at < faults[0] - SAME_FAULT_S]
    if closed_before:
        at, episode = max(closed_before, key=lambda pair: pair[0])
        previous = stored_measurement(episode, at)
    started = input_started_at(client, job.key)
    if started is None:
        started = now  # no input yet: nothing was normal before any fault (not measurable)
    read_from = faults[0] - config.reference_window_s
    if previous is not None and previous.reference is not None:
        read_from = min(read_from, previous.reference[0])
    records = read_progress(client, job.key, read_from - 5, count=PROGRESS_READ_LIMIT)
    watch_ended = not job.is_live or now - faults[-1] > GIVE_UP_AFTER_S
    if registered_app(job.topology) is not None:
        measured = measure_app_faults(
            records, faults, end=now - judged_until(config), watch_ended=watch_ended
        )
    else:
        measured = measure_faults(
            records,
            faults,
            input_started_at=started,
            end=now - judged_until(config),
            watch_ended=watch_ended,
            settings=recovery_settings(config),
            previous=previous,
        )
    output_times = [r.at for r in records if r.is_output]
    closed = 0
    for episode in open_episodes:
        at = fault_time(episode, config).timestamp()
        # The fault this episode belongs to: the latest grouped fault time at or before it.
        figures = [m for m in measured if m.fault_at <= at][-1]
        record_phases(episode, client, at, output_times, closing=figures.final)
        if figures.final:
            record_measurement(episode, figures)
            closed += 1
    if closed and has_ground_truth(job):
        tasks.send(tasks.AUDIT_EPISODES, job.pk)
    return closed


def episode_measurement(episode: RecoveryEpisode) -> dict:
    """An episode's measured figures, in the benchmark's field names (for bench.json)."""
    return {
        "episode": episode.pk,
        "stage": episode.stage,
        "downtime_s": episode.downtime_s,
        "recovery_time_s": episode.recovery_time_s,
        "peak_p99_ms": episode.peak_p99_ms,
        "watched_s": episode.watched_s,
        "phases_s": recovery_phases.phase_seconds(episode.phases),
    }


def faults_since(job: Job, seconds: float) -> dict[str, int]:
    """Failures per operator in the last `seconds` (every operator of a failed stage counts)."""
    since = timezone.now() - timedelta(seconds=seconds)
    failed_stages = list(
        ControlDecision.objects.filter(
            job=job, kind=ControlDecision.Kind.FAILURE, at__gte=since
        ).values_list("stage", flat=True)
    )
    counts: dict[str, int] = {}
    for op in Operator.objects.filter(job=job, stage__in=failed_stages):
        counts[op.name] = failed_stages.count(op.stage)
    return counts
