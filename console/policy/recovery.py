"""Measuring a recovery (OSPBench / van Dongen, ShuffleBench / Vogel et al.).

`detect_recovery` finds the fault and the recovery in a throughput and p90-latency series:

1. Reference: after `warmup_s` from the first sample, the next `reference_window_s` seconds are
   assumed fault-free. Their smoothed throughput and latency give a mean and a standard deviation.
2. Band: throughput is normal when within +-max(band*mean, noise_sigmas*std) of its mean (both
   sides: a catch-up burst above normal is still part of the recovery); latency is normal when at
   most mean + max(band*mean, noise_sigmas*std) (one side: lower latency than the reference is not
   a symptom; a restarted query often runs with warmer caches). The std term keeps the band wider
   than the measured noise so normal jitter is not taken for a fault; with the paper's 15% band
   and a steady job it rarely matters.
3. Fault: the first sample after the reference window where the trailing moving average
   (`smoothing_s`) of either signal leaves its band, unless `fault_time` is given. The trailing
   average keeps detection causal, so the same rule works online.
4. Recovery: the first sample at or after the fault from which the leading moving average (the
   next `smoothing_s` seconds) of both signals stays in band for `stable_window_s`. The leading
   window dates the recovery when the signal is back rather than `smoothing_s` later; the series
   must extend `stable_window_s` past that point, else the recovery is not confirmed (None).

Assumptions: samples are time-ordered and roughly regular, and an outage appears as samples with
zero throughput (and growing latency), not as missing samples; the reference window contains no
fault; times are in seconds on any common origin.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from spark_runtime.progress import ProgressRecord

DEFAULT_SMOOTHING_S = 5.0
DEFAULT_NOISE_SIGMAS = 3.0


@dataclass(frozen=True)
class Reference:
    """What "normal" looked like, and the resulting band limits."""

    throughput_mean: float
    throughput_std: float
    throughput_half_width: float
    latency_mean: float
    latency_std: float
    latency_limit: float


@dataclass(frozen=True)
class RecoveryResult:
    """fault_at and recovered_at are times on the input's axis; None when not found."""

    fault_at: float | None
    recovered_at: float | None
    recovery_time_s: float | None
    reference: Reference
    note: str

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)


def _window_means(times: np.ndarray, values: np.ndarray, width: float, leading: bool) -> np.ndarray:
    """Mean of values in (t-width, t] (trailing) or [t, t+width) (leading), for each t."""
    prefix = np.concatenate(([0.0], np.cumsum(values)))
    means = np.empty(len(times))
    for i, t in enumerate(times):
        if leading:
            lo = i
            hi = bisect.bisect_left(times, t + width)
        else:
            lo = bisect.bisect_right(times, t - width)
            hi = i + 1
        means[i] = (prefix[hi] - prefix[lo]) / (hi - lo)
    return means


def detect_recovery(
    times: Sequence[float],
    throughput: Sequence[float],
    p90_latency: Sequence[float],
    *,
    fault_time: float | None = None,
    warmup_s: float,
    reference_window_s: float,
    band: float,
    stable_window_s: float,
    smoothing_s: float = DEFAULT_SMOOTHING_S,
    noise_sigmas: float = DEFAULT_NOISE_SIGMAS,
    latency_floor: float = 0.0,
) -> RecoveryResult:
    """Find the fault and the recovery in a series (method in the module docstring).

    Raises ValueError for mismatched lengths, unsorted times, or a reference window without
    enough samples or overlapping a given fault_time.
    """
    t = np.asarray(times, dtype=float)
    thr = np.asarray(throughput, dtype=float)
    lat = np.asarray(p90_latency, dtype=float)
    if not len(t) == len(thr) == len(lat):
        raise ValueError(
            f"lengths differ: {len(t)} times, {len(thr)} throughput, {len(lat)} latency"
        )
    if len(t) == 0 or np.any(np.diff(t) < 0):
        raise ValueError("times must be non-empty and sorted")
    if smoothing_s <= 0 or stable_window_s <= 0 or reference_window_s <= 0:
        raise ValueError("smoothing_s, stable_window_s and reference_window_s must be positive")

    ref_start = t[0] + warmup_s
    ref_end = ref_start + reference_window_s
    trailing_thr = _window_means(t, thr, smoothing_s, leading=False)
    trailing_lat = _window_means(t, lat, smoothing_s, leading=False)
    # Reference statistics only from points whose whole trailing window is inside the reference
    # window, so warm-up samples do not leak into "normal".
    in_ref = (t - smoothing_s >= ref_start) & (t < ref_end)
    if in_ref.sum() < 2:
        raise ValueError(
            f"reference window [{ref_start:g}, {ref_end:g}) holds fewer than 2 samples with a "
            f"full {smoothing_s:g} s smoothing window; lengthen reference_window_s"
        )
    if fault_time is not None and fault_time < ref_end:
        raise ValueError(
            f"fault_time {fault_time:g} is inside the reference window (ends {ref_end:g})"
        )

    thr_mean = float(trailing_thr[in_ref].mean())
    thr_std = float(trailing_thr[in_ref].std())
    lat_mean = float(trailing_lat[in_ref].mean())
    lat_std = float(trailing_lat[in_ref].std())
    half_width = max(band * abs(thr_mean), noise_sigmas * thr_std)
    # `latency_floor` (same unit as the latencies) keeps the latency band at least that wide: at
    # sub-second latencies 15% is finer than a micro-batch engine's granularity (one trigger).
    lat_limit = lat_mean + max(band * abs(lat_mean), noise_sigmas * lat_std, latency_floor)
    reference = Reference(thr_mean, thr_std, half_width, lat_mean, lat_std, lat_limit)

    def normal(thr_values: np.ndarray, lat_values: np.ndarray) -> np.ndarray:
        return (np.abs(thr_values - thr_mean) <= half_width) & (lat_values <= lat_limit)

    if fault_time is None:
        out = ~normal(trailing_thr, trailing_lat) & (t >= ref_end)
        if not out.any():
            return RecoveryResult(None, None, None, reference, "no fault detected")
        fault_at = float(t[np.argmax(out)])
        note = "fault detected where the trailing average left the band"
    else:
        fault_at = float(fault_time)
        note = "fault time given"

    ok = normal(
        _window_means(t, thr, smoothing_s, leading=True),
        _window_means(t, lat, smoothing_s, leading=True),
    )
    # next_bad[i]: index of the first out-of-band sample at or after i (len(t) if none).
    next_bad = np.empty(len(t), dtype=int)
    following = len(t)
    for i in range(len(t) - 1, -1, -1):
        if not ok[i]:
            following = i
        next_bad[i] = following
    start = bisect.bisect_left(t, fault_at)
    for j in range(start, len(t)):
        if t[j] + stable_window_s > t[-1]:
            break
        last = bisect.bisect_right(t, t[j] + stable_window_s) - 1
        if next_bad[j] > last:
            recovered_at = float(t[j])
            return RecoveryResult(fault_at, recovered_at, recovered_at - fault_at, reference, note)
    return RecoveryResult(
        fault_at, None, None, reference, f"{note}; not back in band for {stable_window_s:g} s"
    )


def output_gap(output_times: Iterable[float], fault_time: float | None = None) -> float | None:
    """Downtime: the longest gap between consecutive output events (seconds).

    With `fault_time`, only gaps that end after the fault count (the gap spanning the fault
    included). Returns 0.0 with fewer than two events, and None when no output follows the fault
    (the output never resumed, so the downtime is unbounded).
    """
    ordered = sorted(output_times)
    if fault_time is not None and (not ordered or ordered[-1] <= fault_time):
        return None
    gaps = [
        b - a
        for a, b in zip(ordered, ordered[1:], strict=False)
        if fault_time is None or b > fault_time
    ]
    return max(gaps, default=0.0)


def peak(series: Iterable[tuple[float, float]], start: float, end: float) -> float | None:
    """Largest value among (time, value) pairs with start <= time <= end (e.g. peak p99 latency
    during a recovery); None when no sample falls in the range."""
    values = [v for ts, v in series if start <= ts <= end and not math.isnan(v)]
    return max(values, default=None)


@dataclass(frozen=True)
class LossReport:
    """lost: expected ids never emitted; duplicated: ids emitted more than once; unexpected: ids
    emitted that were never input."""

    lost: int
    duplicated: int
    unexpected: int

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)


def lost_and_duplicates(
    input_ids: Iterable[Hashable], output_ids: Iterable[Hashable]
) -> LossReport:
    """Compare the ids that went in with the ids that came out.

    Assumes one expected output per input id, with outputs carrying (or mapped back to) their
    input's id; for derived records (`uuid-k`) map each output to its expected id first. Each
    input id is counted once even if it was input twice (a replayed input is not a new record).
    """
    expected = set(input_ids)
    emitted = Counter(output_ids)
    return LossReport(
        lost=len(expected - emitted.keys()),
        duplicated=sum(1 for count in emitted.values() if count > 1),
        unexpected=len(emitted.keys() - expected),
    )


# --- the output series of a job, from its progress records --------------------------------


@dataclass
class OutputSeries:
    """Per-second output of a job: times (epoch s), events output, p90 and p99 latency (ms)."""

    times: list[float]
    throughput: list[float]
    p90_ms: list[float]
    p99_ms: list[float]
    output_times: list[float]


def output_series(records: Iterable[ProgressRecord], start: float, end: float) -> OutputSeries:
    """Build the per-second series over [start, end) from progress records (any order).

    Only batches of a final stage written by a primary are output a consumer sees. Throughput is
    the final stage's input rows per second (its written rows are upserts of distinct keys, so
    they say little about throughput); a second without output gets zero throughput and a
    latency that keeps growing (time since the last output plus that output's latency), which is
    how an outage looks to a consumer and what `detect_recovery` expects.
    """
    seconds = max(0, int(math.ceil(end - start)))
    rows = [0.0] * seconds
    p90: list[float | None] = [None] * seconds
    p99: list[float | None] = [None] * seconds
    output_times = []
    for record in records:
        at = record.at
        if not record.is_output or not start <= at < end:
            continue
        output_times.append(at)
        slot = int(at - start)
        rows[slot] += record.input_rows
        for target, value in ((p90, record.latency_p90), (p99, record.latency_p99)):
            if value is not None:
                target[slot] = max(target[slot] or 0.0, value * 1000.0)
    times = [start + i for i in range(seconds)]
    return OutputSeries(
        times, rows, _fill_outage(times, p90), _fill_outage(times, p99), sorted(output_times)
    )


def _fill_outage(times: list[float], latency: list[float | None]) -> list[float]:
    """Seconds without output: the last latency plus the time since that output."""
    filled = []
    last_value, last_time = None, None
    for t, value in zip(times, latency, strict=True):
        if value is not None:
            last_value, last_time = value, t
            filled.append(value)
        elif last_value is None:
            filled.append(0.0)
        else:
            filled.append(last_value + (t - last_time) * 1000.0)
    return filled
