"""Measuring recovery episodes from what the job actually emitted.

The data plane publishes one progress record per micro-batch of each replica. Only batches of a
final stage written by a primary are output the user sees, so the series is built from those:
per second, the events that reached the output (the final stage's input rows: for wordcount the
rows written are upserts of distinct words, bounded by the vocabulary, so they say little about
throughput) and the p90/p99 event-time latency. A second with no output while
the job is down gets zero throughput and a latency that keeps growing (time since the last output
plus that output's latency): that is how an outage looks to a consumer, and what the detector
(console.policy.recovery, the ShuffleBench method) expects.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from console.models import ControlDecision, Job, Operator, RecoveryEpisode
from console.policy.config import PolicyConfig
from console.policy.recovery import detect_recovery, output_gap, output_series
from spark_runtime.progress import ProgressRecord, read_progress

GIVE_UP_AFTER_S = 600.0
PROGRESS_READ_LIMIT = 20_000


def fault_time(episode: RecoveryEpisode, config: PolicyConfig) -> datetime:
    """When the fault happened: the injection time, else detection minus the heartbeat timeout."""
    if episode.fault is not None and episode.fault.injected_at is not None:
        return episode.fault.injected_at
    return episode.detected_at - timedelta(seconds=config.heartbeat_timeout_s)


def measure_episode(
    episode: RecoveryEpisode, records: list[ProgressRecord], config: PolicyConfig, now: float
) -> bool:
    """Fill in downtime, recovery time and peak p99 once the job is back; True when closed.

    The reference window is the `reference_window_s` before the fault (after the job's warm-up);
    recovery needs `recovery_stable_window_s` of normal output after it.
    """
    fault_at = fault_time(episode, config).timestamp()
    started = episode.job.started_at.timestamp() if episode.job.started_at else fault_at - 120
    reference_start = max(started + config.warmup_s, fault_at - config.reference_window_s)
    series = output_series(records, reference_start, now)
    if not series.times:
        return False
    downtime = output_gap(series.output_times, fault_time=fault_at)
    try:
        result = detect_recovery(
            series.times,
            series.throughput,
            series.p90_ms,
            fault_time=fault_at,
            warmup_s=0.0,
            reference_window_s=max(fault_at - reference_start - 1, 1.0),
            band=config.recovery_band,
            stable_window_s=config.recovery_stable_window_s,
        )
        recovered_at, note = result.recovered_at, result.note
    except ValueError as exc:
        # Too little normal output before the fault to learn a band from.
        recovered_at, note = None, f"no reference window: {exc}"
    gave_up = now - fault_at > GIVE_UP_AFTER_S
    if recovered_at is None and not gave_up:
        return False
    if recovered_at is not None and downtime is not None:
        # Recovery is downtime plus catch-up: never shorter than the output gap, even when the
        # smoothed signals never left the band (a gap of about a second after a promotion).
        recovered_at = max(recovered_at, fault_at + downtime)
    end = recovered_at if recovered_at is not None else now
    peak = max(
        (v for t, v in zip(series.times, series.p99_ms, strict=True) if fault_at <= t <= end),
        default=None,
    )
    episode.downtime_s = None if downtime is None else round(downtime, 2)
    episode.recovery_time_s = None if recovered_at is None else round(recovered_at - fault_at, 2)
    episode.recovered_at = (
        datetime.fromtimestamp(recovered_at, tz=UTC) if recovered_at is not None else None
    )
    episode.peak_p99_ms = None if peak is None else round(peak, 1)
    episode.notes = (
        f"{episode.notes}; {note}"
        if not gave_up
        else (f"{episode.notes}; not back to normal within {GIVE_UP_AFTER_S:.0f} s ({note})")
    )
    episode.save()
    return True


def measure_open_episodes(job: Job, client, config: PolicyConfig) -> int:
    """Try to close every open episode of the job; returns how many closed."""
    open_episodes = list(
        job.recoveries.filter(recovered_at__isnull=True, recovery_time_s__isnull=True)
        .exclude(notes__contains="not back to normal")
        .select_related("fault", "job")
    )
    if not open_episodes:
        return 0
    earliest = min(fault_time(e, config) for e in open_episodes).timestamp()
    records = read_progress(
        client, job.key, earliest - config.reference_window_s - 5, count=PROGRESS_READ_LIMIT
    )
    now = timezone.now().timestamp()
    return sum(measure_episode(e, records, config, now) for e in open_episodes)


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
