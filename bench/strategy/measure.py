"""Steady-state figures and the fault schedule of one benchmark run.

Faults are measured by the console's own measurement (console.policy.recovery.measure_faults),
with the benchmark's warm-up, stable window and steady window as its settings. Steady latency
percentiles are weighted by the events of each micro-batch.
"""

from __future__ import annotations

from console.policy.recovery import output_series
from spark_runtime.progress import ProgressRecord


def fault_schedule(warmup_s: float, duration_s: float, faults: int) -> list[float]:
    """Fault times in seconds after the input starts: evenly spaced over the measured duration
    that follows the warm-up, the last one a spacing before its end (time to recover)."""
    spacing = duration_s / (faults + 1)
    return [round(warmup_s + spacing * (i + 1), 1) for i in range(faults)]


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


def downsample_series(
    records: list[ProgressRecord], start: float, end: float, input_end: float | None = None
) -> dict:
    """Per-second throughput and p99 over [start, end), times relative to `start` (for plots).

    With `input_end`, the series stops a second after both the input's end and the last output:
    past them nothing is waiting for output, and the p99 of a second without output (the
    latency of the last output plus the time since it, `output_series`) would climb for ever.
    """
    series = output_series(records, start, end)
    if input_end is not None:
        last_output = max(series.output_times, default=start)
        end = min(end, max(input_end, last_output) + 1.0)
    kept = [i for i, t in enumerate(series.times) if t < end]
    return {
        "t": [round(series.times[i] - start, 1) for i in kept],
        "throughput": [series.throughput[i] for i in kept],
        "p99_ms": [round(series.p99_ms[i], 1) for i in kept],
    }
