"""The alert latency benchmark's arithmetic (bench/alert_latency.py): when a condition became
true, from an alert's payload or from the stage's progress stream, and the summary."""

from __future__ import annotations

import pytest

from bench.alert_latency import (
    Measured,
    first_slow_batch_at,
    held_past_limit,
    render,
    summarize,
)
from spark_runtime import keys as data_keys
from tests.factories import progress_record


def test_a_condition_measured_at_the_raise_became_true_its_excess_before():
    payload = {"opened_at": 1000.0, "details": {"no_output_s": 3.5}}
    assert held_past_limit(payload, "no_output_s", 2.0) == pytest.approx(998.5)


def test_the_first_slow_batch_is_dated_by_its_stream_entry(redis_conn):
    job = "alert-latency-unit"
    stream = data_keys.progress(job)
    redis_conn.delete(stream)
    entries = [
        ("1000000-0", progress_record(stage="count", batch_ms=500.0, at=999.0)),
        ("1001000-0", progress_record(stage="split", batch_ms=9000.0, at=1000.0)),  # other stage
        ("1002000-0", progress_record(stage="count", role="standby", batch_ms=9000.0, at=1001.0)),
        ("1003500-0", progress_record(stage="count", batch_ms=6500.0, at=997.0)),
        ("1004000-0", progress_record(stage="count", batch_ms=7000.0, at=997.5)),
    ]
    try:
        for entry_id, record in entries:
            redis_conn.xadd(stream, record.to_fields(), id=entry_id)
        assert first_slow_batch_at(redis_conn, job, "count", 1000.0, 3.0) == 1003.5
        assert first_slow_batch_at(redis_conn, job, "count", 1003.6, 3.0) == 1004.0
        assert first_slow_batch_at(redis_conn, job, "count", 1000.0, 8.0) is None
    finally:
        redis_conn.delete(stream)


def test_the_summary_gives_each_event_and_all_alerts():
    measured = [
        Measured("output-stalled", 1, true_at=10.0, opened_at=10.5, received_at=11.0),
        Measured("output-stalled", 2, true_at=20.0, opened_at=21.0, received_at=23.0),
        Measured("recovery-slow", 1, true_at=30.0, opened_at=30.2, received_at=30.3),
    ]
    summary = summarize(measured)
    stalled = summary["events"]["output-stalled"]
    assert stalled["count"] == 2
    assert stalled["latency_s"]["p99"] == pytest.approx(3.0)
    assert stalled["latency_s"]["max"] == pytest.approx(3.0)
    assert stalled["detection_s"]["p50"] == pytest.approx(0.5)
    assert summary["all"]["count"] == 3
    assert "job-unprotected" not in summary["events"]
    table = render(summary, "python manage.py alert_latency", "today", "1.0")
    assert "| `recovery-slow` | 1 | 0.30 s |" in table
    assert "| all | 3 |" in table
