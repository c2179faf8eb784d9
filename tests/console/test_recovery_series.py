"""Building the per-second output series the recovery detector reads (pure functions)."""

import pytest

from console.policy.recovery import output_series
from tests.factories import progress_record


def record(at, written, p90=0.5, p99=0.8, role="primary", final=True, input_rows=None):
    return progress_record(
        at=at,
        written=written,
        input_rows=written if input_rows is None else input_rows,
        latency_p90=p90,
        latency_p99=p99,
        role=role,
        final=final,
    )


def test_rows_are_summed_per_second_and_latency_converted_to_ms():
    series = output_series([record(100.2, 10), record(100.7, 5), record(101.1, 7)], 100.0, 102.0)
    assert series.times == [100.0, 101.0]
    assert series.throughput == [15.0, 7.0]
    assert series.p90_ms == [500.0, 500.0]
    assert series.output_times == [100.2, 100.7, 101.1]


def test_throughput_counts_events_reaching_the_output_not_upserts():
    # 300 words in, 40 distinct words upserted: 300 events reached the output.
    series = output_series([record(100.5, 40, input_rows=300)], 100.0, 101.0)
    assert series.throughput == [300.0]


def test_a_batch_that_wrote_nothing_is_no_output():
    series = output_series([record(100.5, 0, input_rows=50)], 100.0, 101.0)
    assert series.throughput == [0.0] and series.output_times == []


def test_standby_and_intermediate_batches_are_not_output():
    records = [record(100.5, 10, role="standby"), record(100.6, 10, final=False)]
    series = output_series(records, 100.0, 101.0)
    assert series.throughput == [0.0]
    assert series.output_times == []


def test_latency_grows_through_an_outage():
    # Output at 100.x with p99 0.8 s, nothing in 101 and 102, output again at 103.
    series = output_series([record(100.5, 10), record(103.5, 10, p99=2.0)], 100.0, 104.0)
    assert series.throughput == [10.0, 0.0, 0.0, 10.0]
    assert series.p99_ms == [800.0, 1800.0, 2800.0, 2000.0]


def test_the_latency_limit_is_learned_on_the_output_there_is_not_the_seconds_before_it():
    from console.policy.recovery import RecoverySettings, latency_limit_ms

    settings = RecoverySettings(
        band=0.15, stable_window_s=10, reference_window_s=60, warmup_s=0, latency_floor_ms=100
    )
    # Output from 130 on, in a window starting at 100: p90 alternating 0.4 and 0.6 s.
    steady = [record(130.5 + i, 10, p90=0.4 + 0.2 * (i % 2)) for i in range(30)]
    limit = latency_limit_ms(steady, 100.0, 160.0, settings)
    # Computed by hand from the 5 s trailing means over [135, 160): 0.48 or 0.52 s, mean 0.5,
    # std 0.02: limit = 500 + max(0.15 * 500, 3 * 20, 100) = 600 ms. The 30 s without output
    # (latency 0) left in would have pulled the mean down to about 0.25 s.
    assert limit == pytest.approx(600.0, abs=5)
    # Less than MIN_REFERENCE_S (10 s) of output: nothing to learn from.
    assert latency_limit_ms(steady[-5:], 100.0, 160.0, settings) is None
