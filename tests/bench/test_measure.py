"""Per-fault and steady figures on synthetic progress records with known answers."""

from console.bench import measure
from tests.factories import progress_record


def batch(at, rows=100, p50=0.5, p90=0.8, p99=1.0, role="primary", final=True, stage="count"):
    return progress_record(
        at=at, role=role, final=final, written=5, input_rows=rows, stage=stage, segment="0",
        latency_p50=p50, latency_p90=p90, latency_p99=p99,
    )  # fmt: skip


def test_fault_schedule_spaces_faults_evenly_after_the_warmup():
    assert measure.fault_schedule(30, 200, 4) == [70.0, 110.0, 150.0, 190.0]
    assert measure.fault_schedule(20, 70, 1) == [55.0]
    assert measure.fault_schedule(20, 70, 0) == []


def test_outage_of_ten_seconds_gives_its_downtime_and_recovery():
    # One batch per second at t=0.5, 1.5, ...; the fault at 40; no output during [40, 50).
    records = [batch(t + 0.5) for t in range(0, 40)]
    records += [batch(t + 0.5) for t in range(50, 90)]
    figures = measure.fault_figures(
        records, fault_at=40.0, until=90.0, reference=(5.0, 35.0), band=0.15, stable_window_s=10
    )
    # Last output 39.5, next 50.5: an 11 s gap. Back in band from the first full second of
    # output (50), so recovery = 10 s, raised to the downtime (11 s).
    assert figures.downtime_s == 11.0
    assert figures.recovery_time_s == 11.0
    # Outage latency grows from the last p99 (1000 ms) by 1000 ms a second, to 1000 + 10 * 1000.
    assert figures.peak_p99_ms == 11000.0


def test_a_job_still_down_from_the_previous_fault_counts_downtime_from_this_fault():
    # Output stops at 40 (first fault), and only resumes at 70.5, after a second fault at 60.
    records = [batch(t + 0.5) for t in range(0, 40)] + [batch(t + 0.5) for t in range(70, 110)]
    figures = measure.fault_figures(
        records, fault_at=60.0, until=110.0, reference=(5.0, 35.0), band=0.15,
        stable_window_s=10, previous_fault_at=40.0,
    )  # fmt: skip
    assert figures.downtime_s == 10.5  # 60 -> 70.5, not 39.5 -> 70.5
    assert figures.watched_s == 50.0


def test_no_output_after_the_fault_is_never_a_recovery():
    # A noisy reference (throughput 0 or 200 a second) makes a band that zero fits in.
    records = [batch(t + 0.5, rows=200 * (t % 2)) for t in range(0, 40)]
    figures = measure.fault_figures(
        records, fault_at=40.0, until=90.0, reference=(5.0, 35.0), band=0.15, stable_window_s=10
    )
    assert (figures.downtime_s, figures.recovery_time_s) == (None, None)
    assert "not back to normal" in figures.note


def test_latency_floor_keeps_a_sub_second_band_from_being_finer_than_a_trigger():
    # p90 400 ms before the fault, 600 ms after it: 50% above, but only 200 ms.
    records = [batch(t + 0.5, p90=0.4) for t in range(0, 40)]
    records += [batch(t + 0.5, p90=0.6) for t in range(45, 90)]
    strict = measure.fault_figures(
        records, fault_at=40.0, until=90.0, reference=(5.0, 35.0), band=0.15, stable_window_s=10
    )
    floored = measure.fault_figures(
        records, fault_at=40.0, until=90.0, reference=(5.0, 35.0), band=0.15,
        stable_window_s=10, latency_floor_ms=500,
    )  # fmt: skip
    assert strict.recovery_time_s is None
    # Output resumes at 45.5 (gap 6 s); in band from the first full second of output.
    assert floored.recovery_time_s == 6.0


def test_never_back_in_band_is_reported_not_guessed():
    records = [batch(t + 0.5) for t in range(0, 40)]
    records += [batch(t + 0.5, rows=20) for t in range(45, 90)]  # a fifth of the throughput
    figures = measure.fault_figures(
        records, fault_at=40.0, until=90.0, reference=(5.0, 35.0), band=0.15, stable_window_s=10
    )
    assert figures.recovery_time_s is None
    assert "not back to normal" in figures.note
    assert figures.downtime_s == 6.0


def test_steady_figures_weight_batches_by_their_events():
    records = [
        batch(10.5, rows=300, p50=0.1, p99=0.2),
        batch(11.5, rows=100, p50=0.9, p99=3.0),
        batch(12.5, rows=100, p50=0.2, p99=0.4, role="standby"),  # not output: ignored
        batch(13.5, rows=100, p50=0.2, p99=0.4, final=False),  # not final: ignored
        batch(13.6, rows=50, final=False, stage="split"),  # read the input: throughput
        batch(13.7, rows=30, final=False, stage="split", role="standby"),  # a standby's read
    ]
    steady = measure.steady_figures(records, 10.0, 14.0, input_stage="split")
    # 400 output events: 300 at p50 100 ms, 100 at 900 ms -> median 100 ms; the 99th
    # percentile of the batch p99s is 3000 ms; the primary of split read 50 events in 4 s.
    assert steady == {"p50_ms": 100.0, "p99_ms": 3000.0, "throughput_eps": 12.5}


def test_weighted_percentile():
    assert measure.weighted_percentile([3, 1, 2], [1, 1, 2], 0.5) == 2
    assert measure.weighted_percentile([], [], 0.5) is None
