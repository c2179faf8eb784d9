"""The failover benchmark's figures from a scenario's records (bench.dataplane.failover.judge):
the console's recovery judgement on synthetic progress records with known answers.

The kill is at 20 s; output is one batch a second at t + 0.5 (p90 0.8 s, p99 1 s, 100 rows)
unless a test says otherwise, and the results' watermark changes every 0.5 s while it flows."""

from argparse import Namespace

import pytest

from bench.dataplane import failover
from tests.factories import progress_record

ARGS = Namespace(warmup=15.0, band=0.15, stable_window=10.0)
KILLED_AT, STEADY_AT, ENDED = 20.0, 4.0, 80.0


def output(start, end, rows=100):
    return [
        progress_record(at=t + 0.5, written=5, input_rows=rows, latency_p90=0.8, latency_p99=1.0)
        for t in range(start, end)
    ]


def changes(start, end):
    return [start + k * 0.5 for k in range(int((end - start) * 2))]


def test_the_gap_is_on_the_watermark_and_the_recovery_on_the_band():
    records = output(0, 20) + output(26, 80)
    figures = failover.judge(
        records, changes(0, 20) + changes(26, 80), KILLED_AT, STEADY_AT, ENDED, ARGS
    )
    # Last write 19.5, next 26.0 (the progress records alone would say 19.5 -> 26.5).
    assert figures["gap"] == 6.5
    # In band from 26 s on, never sooner than the output came back: 6.5 s after the kill.
    assert figures["recovery"] == 6.5
    # A second without output counts the time since the last one: 1 s + 6 s at 25 s.
    assert figures["peak_p99"] == 7.0
    assert figures["baseline_p99"] == 1.0


def test_output_back_at_a_fifth_of_the_rate_is_not_a_recovery():
    records = output(0, 20) + output(26, 80, rows=20)
    figures = failover.judge(
        records, changes(0, 20) + changes(26, 80), KILLED_AT, STEADY_AT, ENDED, ARGS
    )
    assert figures["gap"] == 6.5
    assert figures["recovery"] is None
    assert figures["watched"] == 60.0
    assert "not back to normal" in figures["note"]


def test_a_warmup_too_short_to_learn_normal_is_refused():
    with pytest.raises(SystemExit) as exited:
        failover.main(["--warmup", "5", "--no-write"])
    assert exited.value.code == 2
