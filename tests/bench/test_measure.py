"""Steady figures and the fault schedule on synthetic progress records with known answers."""

from bench.strategy import measure
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


def test_the_plotted_series_stops_once_the_input_has_ended_and_its_output_is_out():
    """Past the input's end and the last output nothing waits for output: the series ends there
    instead of plotting a p99 that climbs a second per second."""
    records = [batch(1000.0 + t, p99=0.4) for t in range(0, 30)]  # output until 1029
    whole = measure.downsample_series(records, 1000.0, 1060.0)
    assert len(whole["t"]) == 60 and whole["p99_ms"][-1] > 30_000
    cut = measure.downsample_series(records, 1000.0, 1060.0, input_end=1025.0)
    assert cut["t"] == [float(t) for t in range(0, 30)]
    assert max(cut["p99_ms"]) == 400.0 and cut["throughput"] == [100.0] * 30
    # A job still down when the input ended keeps its outage on the plot up to the input's end.
    down = measure.downsample_series(records[:10], 1000.0, 1060.0, input_end=1025.0)
    assert down["t"][-1] == 25.0 and down["p99_ms"][-1] == 400.0 + 16_000.0
