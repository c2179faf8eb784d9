"""Per-fault and steady-state figures of one benchmark run, from the job's progress records.

Measured after the run, over the whole recorded series, the way ShuffleBench and van Dongen's
OSPBench evaluate a run:
- the *reference* is the run's steady window (after the warm-up, before the first fault), so
  every fault of a run is judged against the same "normal";
- fault i is measured on [fault_i, fault_{i+1}) (the next fault, or the end of the input): its
  downtime is the longest output gap spanning or following it, its recovery time the first point
  from which throughput and p90 latency stay in the band for `stable_window_s`
  (console.policy.recovery.detect_recovery; the latency band at least one trigger interval wide,
  500 ms, since 15% of a sub-second latency is finer than a micro-batch's granularity), never
  shorter than the downtime;
- steady latency percentiles are weighted by the events of each micro-batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from console.policy.recovery import detect_recovery, output_gap, output_series
from spark_runtime.progress import ProgressRecord


@dataclass(frozen=True)
class FaultFigures:
    """What one fault cost: output gap, time back to normal, worst p99 latency in between."""

    downtime_s: float | None
    recovery_time_s: float | None
    peak_p99_ms: float | None
    note: str
    # How long after the fault it was watched: an unrecovered fault took longer than this.
    watched_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def fault_schedule(warmup_s: float, duration_s: float, faults: int) -> list[float]:
    """Fault times in seconds after the input starts: evenly spaced over the measured duration
    that follows the warm-up, the last one a spacing before its end (time to recover)."""
    spacing = duration_s / (faults + 1)
    return [round(warmup_s + spacing * (i + 1), 1) for i in range(faults)]


def fault_figures(
    records: list[ProgressRecord],
    *,
    fault_at: float,
    until: float,
    reference: tuple[float, float],
    band: float,
    stable_window_s: float,
    previous_fault_at: float | None = None,
    latency_floor_ms: float = 0.0,
) -> FaultFigures:
    """Figures of the fault at `fault_at` (epoch s), judged on [fault_at, until) against the
    output in the `reference` window (epoch s, start and end).

    The downtime counts from the last output before the fault, but not from before the previous
    fault: if the job was still down from that one, this fault's downtime starts at the fault.
    """
    ref_start, ref_end = reference
    series = output_series(records, ref_start, until)
    keep = [i for i, t in enumerate(series.times) if t < ref_end or t >= fault_at]
    since = max(fault_at - 30, previous_fault_at or ref_start)
    outputs = [t for t in series.output_times if since <= t < until]
    if not any(t < fault_at for t in outputs):
        outputs.insert(0, fault_at)  # already down when the fault came: count from the fault
    downtime = output_gap(outputs, fault_time=fault_at)
    try:
        result = detect_recovery(
            [series.times[i] for i in keep],
            [series.throughput[i] for i in keep],
            [series.p90_ms[i] for i in keep],
            fault_time=fault_at,
            warmup_s=0.0,
            reference_window_s=ref_end - ref_start,
            band=band,
            stable_window_s=stable_window_s,
            latency_floor=latency_floor_ms,
        )
        recovered_at, note = result.recovered_at, result.note
    except ValueError as exc:
        recovered_at, note = None, f"not measurable: {exc}"
    if downtime is None:
        # No output at all before `until`: whatever the smoothed signals did, not recovered.
        recovered_at, note = None, "no output after the fault"
    elif recovered_at is not None:
        recovered_at = max(recovered_at, fault_at + downtime)
    end = recovered_at if recovered_at is not None else until
    peak = max((series.p99_ms[i] for i in keep if fault_at <= series.times[i] <= end), default=None)
    if recovered_at is None and "not measurable" not in note:
        note = f"not back to normal before {until - fault_at:.0f} s ({note})"
    return FaultFigures(
        downtime_s=None if downtime is None else round(downtime, 2),
        recovery_time_s=None if recovered_at is None else round(recovered_at - fault_at, 2),
        peak_p99_ms=None if peak is None else round(peak, 1),
        note=note,
        watched_s=round(until - fault_at, 1),
    )


def weighted_percentile(values: list[float], weights: list[float], q: float) -> float | None:
    """The smallest value whose cumulative weight reaches `q` (0..1) of the total."""
    pairs = sorted((v, w) for v, w in zip(values, weights, strict=True) if w > 0)
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return None
    running = 0.0
    for value, weight in pairs:
        running += weight
        if running >= q * total:
            return value
    return pairs[-1][0]


def steady_figures(
    records: list[ProgressRecord], start: float, end: float, input_stage: str
) -> dict:
    """Latency p50/p99 (ms) and throughput (input events/s) over [start, end).

    Per micro-batch the data plane reports event-time latency percentiles of its events; the
    run's p50 is the events-weighted median of the batch p50s and its p99 the events-weighted
    99th percentile of the batch p99s (an upper bound of the true p99). Throughput counts the
    input events read by the primary of `input_stage` (the stage reading the job's input), so
    strategies that cut the job differently are counted in the same unit.
    """
    batches = [
        r for r in records if r.is_primary and r.final and start <= r.at < end and r.input_rows > 0
    ]

    def percentile(latencies: list[float | None], q: float) -> float | None:
        pairs = [(s * 1000.0, float(r.input_rows)) for s, r in zip(latencies, batches, strict=True)
                 if s is not None]  # fmt: skip
        value = weighted_percentile([v for v, _ in pairs], [w for _, w in pairs], q)
        return None if value is None else round(value, 1)

    read = sum(
        r.input_rows
        for r in records
        if r.is_primary
        and r.stage == input_stage
        and r.segment == "0"  # the stage's first query is the one reading the input
        and start <= r.at < end
    )
    return {
        "p50_ms": percentile([r.latency_p50 for r in batches], 0.5),
        "p99_ms": percentile([r.latency_p99 for r in batches], 0.99),
        "throughput_eps": round(read / max(end - start, 1e-9), 1),
    }


def downsample_series(records: list[ProgressRecord], start: float, end: float) -> dict:
    """Per-second throughput and p99 over [start, end), times relative to `start` (for plots)."""
    series = output_series(records, start, end)
    return {
        "t": [round(t - start, 1) for t in series.times],
        "throughput": series.throughput,
        "p99_ms": [round(v, 1) for v in series.p99_ms],
    }
