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
   must extend `stable_window_s + smoothing_s` past that point (every leading average in the
   stable window complete), else the recovery is not confirmed (None). So the answer never
   changes as samples are added: measured live it equals what is measured after the run.

Assumptions: samples are time-ordered and roughly regular, and an outage appears as samples with
zero throughput (and growing latency), not as missing samples; the reference window contains no
fault; times are in seconds on any common origin.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace

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
    throughput_floor: float = 0.0,
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
    # `throughput_floor` keeps the throughput band at least that wide on either side: the
    # smoothed throughput of a job that outputs in seconds-apart batches moves by a whole batch.
    half_width = max(band * abs(thr_mean), noise_sigmas * thr_std, throughput_floor)
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
        # The leading averages over the whole stable window must be complete, so that later
        # samples cannot change the answer (a live series' last second may still be filling).
        if t[j] + stable_window_s + smoothing_s > t[-1]:
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


def cadence_floors(
    series: OutputSeries, start: float, end: float, settings: RecoverySettings
) -> tuple[float, float]:
    """(latency floor ms, throughput floor rows/s) of a band learned on `series` in [start, end):
    what the job's own output cadence makes normal jitter.

    A job whose output comes in batches seconds apart (its sources hold light input,
    `light_input_wait_s`, or its trigger is long) leaves seconds without output in the series:
    there its latency climbs by a second each second until the next batch, and its throughput,
    smoothed over DEFAULT_SMOOTHING_S, moves by a whole batch as a window holds one batch more
    or fewer. For such a job (median time between seconds with output above one second) the
    latency band is at least that median time, and the throughput band at least the
    reference's largest second of output spread over the smoothing window, within the band's
    own margin. A job with output every second has neither jitter: it keeps
    `settings.latency_floor_ms` and no throughput floor."""
    seconds = [
        (t, rows) for t, rows in zip(series.times, series.throughput, strict=True)
        if start <= t < end and rows > 0
    ]  # fmt: skip
    if len(seconds) < 2:
        return settings.latency_floor_ms, 0.0
    cadence_s = float(np.median(np.diff([t for t, _ in seconds])))
    if cadence_s <= 1.0:
        return settings.latency_floor_ms, 0.0
    largest = max(rows for _, rows in seconds)
    return (
        max(settings.latency_floor_ms, cadence_s * 1000.0),
        (1 + settings.band) * largest / DEFAULT_SMOOTHING_S,
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


def latency_limit_ms(
    records: Iterable[ProgressRecord], start: float, end: float, settings: RecoverySettings
) -> float | None:
    """The p90 output latency (ms) above which output is out of the band learned on the
    job's output in [start, end), as a fault's recovery is judged (`detect_recovery`'s latency
    limit); None when that window holds less than MIN_REFERENCE_S of output to learn from.
    The seconds before the job's first output in the window are left out: their zero latency
    would narrow the band to below what the job's normal output shows."""
    records = list(records)
    first = min((r.at for r in records if r.is_output and start <= r.at < end), default=None)
    if first is None or end - math.floor(first) < MIN_REFERENCE_S:
        return None
    series = output_series(records, math.floor(first), end)
    latency_floor, throughput_floor = cadence_floors(series, math.floor(first), end, settings)
    try:
        result = detect_recovery(
            series.times,
            series.throughput,
            series.p90_ms,
            warmup_s=0.0,
            reference_window_s=end - start,
            band=settings.band,
            stable_window_s=settings.stable_window_s,
            latency_floor=latency_floor,
            throughput_floor=throughput_floor,
        )
    except ValueError:
        return None
    return round(result.reference.latency_limit, 1)


def p90_per_second_ms(records: Iterable[ProgressRecord], start: float, end: float) -> list[float]:
    """The job's p90 output latency (ms) in each second of [start, end), a second without
    output counting as the time since the last one (`output_series`)."""
    return output_series(records, start, end).p90_ms


# --- measuring the faults of a job: the one measurement the console and every benchmark share

# The latency band is at least about a trigger interval and a batch wide (0.5 s; triggers are
# 0.3-0.5 s, spark_runtime.topology): 15% of a sub-second latency is finer than a micro-batch's
# granularity.
LATENCY_FLOOR_MS = 500.0
# Output before the fault counts for its downtime only this far back: a job that had produced
# nothing for longer was already down when the fault came, and the downtime counts from the fault.
DOWNTIME_LOOKBACK_S = 30.0
# Failures found within this many seconds of each other are one fault (a lost node fails every
# stage on it; their heartbeats expire a moment apart).
SAME_FAULT_S = 5.0
# A reference shorter than this (with the 5 s smoothing) holds too few samples to learn a band
# (a first fault soon after the warm-up).
MIN_REFERENCE_S = 10.0


@dataclass(frozen=True)
class RecoverySettings:
    """How faults are judged: the detector's band and stable window, and where "normal" is
    learned (at most `reference_window_s` before the fault, not before `warmup_s` after the
    job's first input)."""

    band: float
    stable_window_s: float
    reference_window_s: float
    warmup_s: float
    latency_floor_ms: float = LATENCY_FLOOR_MS


@dataclass(frozen=True)
class FaultMeasurement:
    """What one fault cost. Times are epoch seconds.

    `final` is False while the fault is still being watched (a live job not yet back to normal
    and no later fault yet): the figures are provisional then. `watched_s` is how long after the
    fault it was watched: its recovery time when it recovered; otherwise the job was not back
    to normal that long after the fault.
    """

    fault_at: float
    downtime_s: float | None
    recovery_time_s: float | None
    recovered_at: float | None
    peak_p99_ms: float | None
    note: str
    watched_s: float
    final: bool
    reference: tuple[float, float] | None

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)


def group_fault_times(times: Iterable[float], within_s: float = SAME_FAULT_S) -> list[float]:
    """Distinct faults from failure times, oldest first: a time within `within_s` of the
    previous fault's (first) time is that same fault."""
    faults: list[float] = []
    for at in sorted(times):
        if not faults or at - faults[-1] > within_s:
            faults.append(at)
    return faults


def _reference(
    fault_at: float,
    previous: FaultMeasurement | None,
    not_before: float,
    settings: RecoverySettings,
) -> tuple[float, float] | None:
    """Where "normal" is learned for the fault at `fault_at`.

    The `reference_window_s` before the fault, after the warm-up. A fault that comes less than
    a reference window after the previous fault's recovery (or while the job is still
    recovering from it, or never recovered) is judged against the previous fault's reference:
    the seconds before it were not normal, or not long enough normal to learn from (after a
    promotion a new standby is still catching up and loads the node).
    """
    if previous is not None and (
        previous.recovered_at is None
        or fault_at - previous.recovered_at < settings.reference_window_s
    ):
        return previous.reference
    start = max(not_before, fault_at - settings.reference_window_s)
    return (start, fault_at) if fault_at - start >= MIN_REFERENCE_S else None


def measure_fault(
    records: list[ProgressRecord],
    *,
    fault_at: float,
    until: float,
    watch_over: bool,
    reference: tuple[float, float] | None,
    settings: RecoverySettings,
    previous_fault_at: float | None = None,
    output_times: Iterable[float] | None = None,
) -> FaultMeasurement:
    """Measure the fault at `fault_at` on the job's output in [fault_at, until).

    - downtime: the longest output gap that spans or follows the fault, up to the end of the
      stable window that confirmed the recovery (or `until`); it counts from the last output
      before the fault, but not from before the previous fault nor from more than
      DOWNTIME_LOOKBACK_S before;
    - recovery: the first point from which throughput and p90 latency stay in the band learned
      on `reference` for the stable window (`detect_recovery`), never shorter than the downtime;
      no output after the fault is never a recovery;
    - peak p99: the worst p99 latency from the fault to the recovery (or `until`).

    The result depends only on output up to the recovery plus the stable and smoothing windows,
    so a live measurement taken as soon as it is final equals one taken after the run.
    `watch_over`: no more output will be judged for this fault (a later fault came at `until`,
    the run ended, or the watch gave up); otherwise an unconfirmed recovery is left provisional.
    `output_times`: the times the job's output changed, when they are observed more finely than
    its progress records say (a benchmark polling the results' watermark); the downtime is then
    measured on them, the recovery and the peak still on the progress records.
    """
    watched = round(until - fault_at, 1)
    since = max(fault_at - DOWNTIME_LOOKBACK_S, previous_fault_at or fault_at - DOWNTIME_LOOKBACK_S)
    observed = (r.at for r in records if r.is_output) if output_times is None else output_times
    output_times = sorted(t for t in observed if since <= t < until)
    detected_at, note, peak = None, "", None
    if reference is None:
        note = "not measurable: no normal output before the fault to learn a band from"
    else:
        ref_start, ref_end = reference
        series = output_series(records, ref_start, until)
        keep = [i for i, t in enumerate(series.times) if t < ref_end or t >= fault_at]
        latency_floor, throughput_floor = cadence_floors(series, ref_start, ref_end, settings)
        try:
            result = detect_recovery(
                [series.times[i] for i in keep],
                [series.throughput[i] for i in keep],
                [series.p90_ms[i] for i in keep],
                fault_time=fault_at,
                warmup_s=0.0,
                reference_window_s=ref_end - ref_start,
                band=settings.band,
                stable_window_s=settings.stable_window_s,
                latency_floor=latency_floor,
                throughput_floor=throughput_floor,
            )
            detected_at, note = result.recovered_at, result.note
        except ValueError as exc:
            note = f"not measurable: {exc}"
    gaps_until = until if detected_at is None else detected_at + settings.stable_window_s
    outputs = [t for t in output_times if t <= gaps_until]
    if not any(t < fault_at for t in outputs):
        outputs.insert(0, fault_at)  # already down when the fault came: count from the fault
    downtime = output_gap(outputs, fault_time=fault_at)
    recovered_at = detected_at
    if downtime is None:
        # No output after the fault: whatever the smoothed signals did, not recovered.
        recovered_at = None
        if reference is not None:
            note = "no output after the fault"
    elif recovered_at is not None:
        recovered_at = max(recovered_at, fault_at + downtime)
    final = recovered_at is not None or watch_over
    if reference is not None:
        end = recovered_at if recovered_at is not None else until
        peak = max(
            (series.p99_ms[i] for i in keep if fault_at <= series.times[i] <= end), default=None
        )
    if recovered_at is None and watch_over and "not measurable" not in note:
        note = f"not back to normal before {watched:.0f} s ({note})"
    return FaultMeasurement(
        fault_at=fault_at,
        downtime_s=None if downtime is None else round(downtime, 2),
        recovery_time_s=None if recovered_at is None else round(recovered_at - fault_at, 2),
        recovered_at=recovered_at,
        peak_p99_ms=None if peak is None else round(peak, 1),
        note=note,
        # A recovered fault was watched until its recovery; an unrecovered one until `until`.
        watched_s=watched if recovered_at is None else round(recovered_at - fault_at, 2),
        final=final,
        reference=reference,
    )


def measure_faults(
    records: list[ProgressRecord],
    fault_times: Sequence[float],
    *,
    input_started_at: float,
    end: float,
    watch_ended: bool,
    settings: RecoverySettings,
    previous: FaultMeasurement | None = None,
    output_times: Sequence[float] | None = None,
) -> list[FaultMeasurement]:
    """Measure every fault of a job, oldest first, the same way live and after a run.

    Fault i is judged on [fault_i, fault_{i+1}) (the last one on [fault, end)); its reference
    follows `_reference`. `watch_ended`: no output after `end` will be judged (the run is over,
    or a live watch gave up); a live caller passes end = now and False. `previous`: the final
    measurement of the fault before the first one given (a live caller keeps it stored rather
    than measuring it again from progress that may have been trimmed since). `output_times`: as
    for `measure_fault`.
    """
    not_before = input_started_at + settings.warmup_s
    measured: list[FaultMeasurement] = []
    times = sorted(fault_times)
    for index, fault_at in enumerate(times):
        later = index + 1 < len(times)
        previous = measured[-1] if measured else previous
        measured.append(
            measure_fault(
                records,
                fault_at=fault_at,
                until=times[index + 1] if later else max(end, fault_at),
                watch_over=later or watch_ended,
                reference=_reference(fault_at, previous, not_before, settings),
                settings=settings,
                previous_fault_at=None if previous is None else previous.fault_at,
                output_times=output_times,
            )
        )
    return measured


def measure_switch(
    records: list[ProgressRecord],
    switched_at: float,
    *,
    input_started_at: float,
    end: float,
    watch_ended: bool,
    settings: RecoverySettings,
) -> FaultMeasurement | None:
    """The output across an upgrade's switch at `switched_at`: the measurement of a fault there
    (`measure_faults`; its downtime is the output gap), None while it is not final.

    Records that begin after the switch (the older ones trimmed from the progress stream) cannot
    say when the output stopped: the gap would count from the first record kept, so it is
    unknown (None) then.
    """
    (measured,) = measure_faults(
        records,
        [switched_at],
        input_started_at=input_started_at,
        end=end,
        watch_ended=watch_ended,
        settings=settings,
    )
    if not measured.final:
        return None
    if not records or records[0].at > switched_at:
        return replace(
            measured,
            downtime_s=None,
            recovery_time_s=None,
            recovered_at=None,
            note="the progress records from before the switch are gone",
        )
    return measured


def measure_app_faults(
    records: list[ProgressRecord],
    fault_times: Sequence[float],
    *,
    end: float,
    watch_ended: bool,
) -> list[FaultMeasurement]:
    """Measure every fault of an existing app's job (spark_runtime/apps.py), oldest first.

    An app's output carries no event time Backstop knows, so there is no latency band to
    return to: an app is recovered when a batch of one of its queries completes on a primary
    after the fault (what `manage.py bench` measures against a cold restart). Fault i is judged
    on [fault_i, fault_{i+1}); downtime and recovery are both the time to that batch.
    """
    times = sorted(fault_times)
    batches = sorted(r.at for r in records if r.is_primary)
    measured = []
    for index, fault_at in enumerate(times):
        later = index + 1 < len(times)
        until = times[index + 1] if later else max(end, fault_at)
        first = next((t for t in batches if fault_at < t < until), None)
        recovery = None if first is None else round(first - fault_at, 2)
        watched = round(until - fault_at, 1) if first is None else recovery
        note = "the app's first batch after the fault"
        if first is None:
            note = f"no batch of the app within {until - fault_at:.0f} s of the fault"
        measured.append(
            FaultMeasurement(
                fault_at=fault_at,
                downtime_s=recovery,
                recovery_time_s=recovery,
                recovered_at=first,
                peak_p99_ms=None,
                note=note,
                watched_s=watched,
                final=first is not None or later or watch_ended,
                reference=None,
            )
        )
    return measured
