"""Recovery detector on synthetic and recorded series, plus the downtime helper."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from console.policy.recovery import (
    detect_recovery,
    output_gap,
)

RECORDING = Path(__file__).resolve().parents[1] / "data" / "recorded_restart_series.json"


def synthetic(seed: int = 7):
    """1 Hz series, 0..300 s: steady 1000 events/s (noise sd 20) and p90 latency 200 ms (sd 10).

    Fault at t=120: throughput 0 for 20 s, then a linear ramp back to 1000 over 140..150.
    Latency grows by 1000 ms per second of outage (120..140, up to 20200 ms), then falls back
    linearly to 200 ms over 140..155.
    """
    rng = np.random.default_rng(seed)
    t = np.arange(0.0, 301.0)
    thr = 1000 + rng.normal(0, 20, len(t))
    lat = 200 + rng.normal(0, 10, len(t))
    down = (t >= 120) & (t < 140)
    thr[down] = 0.0
    ramp = (t >= 140) & (t < 150)
    thr[ramp] = (t[ramp] - 140) / 10 * 1000
    lat[down] = 200 + (t[down] - 120) * 1000
    back = (t >= 140) & (t < 155)
    lat[back] = 20200 - (t[back] - 140) * (20000 / 15)
    return t, thr, lat


DETECTOR = {"warmup_s": 20.0, "reference_window_s": 60.0, "band": 0.15, "stable_window_s": 30.0}


def test_synthetic_fault_and_recovery():
    # Expected by hand (5 s windows on a 1 s grid):
    # fault: the trailing mean at t=120 is (4*1000 + 0)/5 = 800 < 850 (1000 - 15%) -> 120.
    # recovery: the leading mean of latency at t=154 is (1533 + 4*200)/5 = 467 ms, far above the
    # 230 ms limit; at t=155 every value ahead is ~200 ms and throughput ~1000 -> 155.
    # Tolerance: +-2 s for the fault and +-3 s for the recovery (noise, window alignment).
    t, thr, lat = synthetic()
    result = detect_recovery(t, thr, lat, **DETECTOR)
    assert result.fault_at == pytest.approx(120, abs=2)
    assert result.recovered_at == pytest.approx(155, abs=3)
    assert result.recovery_time_s == pytest.approx(35, abs=4)
    assert result.reference.throughput_mean == pytest.approx(1000, abs=10)
    assert result.reference.throughput_half_width == pytest.approx(150, abs=2)
    assert result.reference.latency_limit == pytest.approx(230, abs=3)


def test_given_fault_time_is_used():
    t, thr, lat = synthetic()
    result = detect_recovery(t, thr, lat, fault_time=119.0, **DETECTOR)
    assert result.fault_at == 119.0
    assert result.recovered_at == pytest.approx(155, abs=3)
    assert result.note == "fault time given"


def test_steady_series_has_no_fault():
    t, thr, lat = synthetic()
    steady = detect_recovery(t[:110], thr[:110], lat[:110], **DETECTOR)
    assert steady.fault_at is None and steady.recovered_at is None
    assert steady.note == "no fault detected"


def test_recovery_needs_the_whole_stable_window():
    # Cut the series 20 s after the true recovery: 30 s of stability cannot be confirmed.
    t, thr, lat = synthetic()
    cut = t <= 175
    result = detect_recovery(t[cut], thr[cut], lat[cut], **DETECTOR)
    assert result.fault_at == pytest.approx(120, abs=2)
    assert result.recovered_at is None and result.recovery_time_s is None


def test_catch_up_burst_delays_recovery():
    # Throughput twice the normal rate for 10 s after the outage is still recovery (both sides
    # of the band count for throughput): recovery cannot be dated before the burst ends at 160.
    t, thr, lat = synthetic()
    thr[(t >= 150) & (t < 160)] = 2000
    result = detect_recovery(t, thr, lat, **DETECTOR)
    assert result.recovered_at >= 156


def test_invalid_input():
    t, thr, lat = synthetic()
    with pytest.raises(ValueError, match="lengths"):
        detect_recovery(t, thr[:-1], lat, **DETECTOR)
    with pytest.raises(ValueError, match="sorted"):
        detect_recovery(t[::-1], thr, lat, **DETECTOR)
    with pytest.raises(ValueError, match="reference window"):
        detect_recovery(t, thr, lat, fault_time=50.0, **DETECTOR)
    with pytest.raises(ValueError, match="fewer than 2"):
        detect_recovery(t[:22], thr[:22], lat[:22], **DETECTOR)


def test_recorded_restart_series():
    """A real PySpark query stopped and restarted from its checkpoint (tests/data/record_series.py).

    The rate source releases rows once per second; the query is stopped at `stop_time_s` and
    started again at `restart_time_s`. The detector must place the fault within 2 s after the
    stop (the trailing 5 s mean needs a second or so of zeros) and the recovery after the restart.
    """
    recording = json.loads(RECORDING.read_text())
    stop, restart = recording["stop_time_s"], recording["restart_time_s"]
    result = detect_recovery(
        recording["times"],
        recording["throughput"],
        recording["latency_ms"],
        warmup_s=8.0,  # first batches: JVM and Python warm-up, state store creation
        reference_window_s=14.0,
        band=0.15,
        stable_window_s=10.0,
    )
    assert result.fault_at is not None
    assert stop - 0.5 <= result.fault_at <= stop + 2.0
    assert result.recovered_at is not None
    assert result.recovered_at > restart
    # The output gap of the raw batches straddles the stop and ends after the restart.
    batch_times = [b["t"] for b in recording["batches"] if b["num_input_rows"] > 0]
    gap = output_gap(batch_times, fault_time=stop)
    assert gap >= restart - stop


def test_output_gap_by_hand():
    outputs = [0.0, 1.0, 2.0, 3.0, 9.5, 10.0, 20.0]
    # Longest gap overall: 10 -> 20 = 10 s. After a fault at 3.5: 3 -> 9.5 = 6.5 and 10 -> 20.
    assert output_gap(outputs) == 10.0
    assert output_gap([0.0, 1.0, 2.0, 3.0, 9.5, 10.0], fault_time=3.5) == 6.5
    assert output_gap([5.0]) == 0.0
    assert output_gap([1.0, 2.0], fault_time=3.0) is None  # output never resumed
