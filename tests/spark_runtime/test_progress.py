"""The progress record: its stream encoding, tolerant decoding of older records, and reading the
stream back from a real Redis."""

from __future__ import annotations

import json
import math
import time

from spark_runtime import keys
from spark_runtime.listener import progress_event
from spark_runtime.progress import ProgressRecord, publish_progress, read_progress


def record(**fields) -> ProgressRecord:
    values = {
        "replica": "count-0",
        "stage": "count",
        "role": "primary",
        "node": "node-1",
        "query": "t1.count.0",
        "segment": "0",
        "batch": 7,
        "at": 1700000000.25,
        "input_rows": 120,
        "input_rate": 40.5,
        "processed_rate": 61.0,
        "batch_ms": 1968,
        "state_rows": 33,
        "state_memory_bytes": 40960,
        "rows_out": 30,
        "written": 30,
        "final": True,
        "buffered": 0,
        "latency_p50": 0.4,
        "latency_p90": 0.75,
        "latency_p99": 1.5,
    }
    return ProgressRecord(**{**values, **fields})


# The fields a stage wrote before the record type existed (stage.py built this dict by hand).
OLD_FIELDS = {
    "replica": "count-0",
    "stage": "count",
    "role": "primary",
    "node": "node-1",
    "query": "t1.count.0",
    "segment": "0",
    "batch": "7",
    "at": "1700000000.25",
    "input_rows": "120",
    "input_rate": "40.5",
    "processed_rate": "61.0",
    "batch_ms": "1968",
    "state_rows": "33",
    "state_memory_bytes": "40960",
    "rows_out": "30",
    "written": "30",
    "final": "True",
    "buffered": "0",
    "latency_p50": "0.4",
    "latency_p90": "0.75",
    "latency_p99": "1.5",
}


def test_fields_keep_the_stream_format():
    # The watermark and the sources came later: empty for a batch without them.
    assert record().to_fields() == {**OLD_FIELDS, "watermark": "", "sources": ""}


def test_round_trip():
    original = record(input_rate=None, final=False, latency_p50=None, latency_p99=None)
    assert ProgressRecord.from_fields(original.to_fields()) == original


def test_old_record_reads_with_its_types():
    parsed = ProgressRecord.from_fields(OLD_FIELDS)
    assert parsed.batch == 7 and parsed.input_rows == 120 and parsed.written == 30
    assert parsed.at == 1700000000.25
    assert parsed.processed_rate == 61.0 and parsed.batch_ms == 1968.0
    assert parsed.latency_p99 == 1.5
    assert parsed.final is True


def test_empty_none_and_nan_read_as_none():
    fields = {**OLD_FIELDS, "input_rate": "nan", "processed_rate": "None", "batch_ms": ""}
    fields.update(latency_p50="", latency_p90="None", latency_p99="nan")
    parsed = ProgressRecord.from_fields(fields)
    assert (parsed.input_rate, parsed.processed_rate, parsed.batch_ms) == (None, None, None)
    assert (parsed.latency_p50, parsed.latency_p90, parsed.latency_p99) == (None, None, None)


def test_missing_fields_of_an_old_record():
    # A batch without stats (no latency fields at all) and a record without counters.
    parsed = ProgressRecord.from_fields({"replica": "split-0", "role": "standby", "at": "5.5"})
    assert parsed.replica == "split-0" and parsed.at == 5.5
    assert parsed.stage == "" and parsed.batch == 0 and parsed.written == 0
    assert parsed.input_rate is None and parsed.latency_p99 is None
    assert parsed.final is False


def test_booleans():
    assert ProgressRecord.from_fields({**OLD_FIELDS, "final": "False"}).final is False
    assert ProgressRecord.from_fields({**OLD_FIELDS, "final": ""}).final is False
    assert record(final=False).to_fields()["final"] == "False"


def test_output_is_a_primary_final_batch_that_wrote_something():
    assert record().is_output
    assert not record(role="standby").is_output
    assert not record(final=False).is_output
    assert not record(written=0).is_output


def test_publish_and_read_back_from_redis(redis_conn, job):
    first, second = record(batch=1, at=time.time()), record(batch=2, role="standby")
    publish_progress(redis_conn, job, first)
    publish_progress(redis_conn, job, second)
    # What a reader that predates the record type sees: the same strings.
    _, raw = redis_conn.xrange(keys.progress(job))[0]
    assert raw["batch"] == "1" and raw["final"] == "True" and raw["latency_p99"] == "1.5"
    assert read_progress(redis_conn, job) == [first, second]


def test_read_progress_keeps_to_the_time_window(redis_conn, job):
    # Stream ids are the publish time in milliseconds: give three entries known ids.
    for ms, batch in ((1_000, 1), (2_000, 2), (3_000, 3)):
        redis_conn.xadd(keys.progress(job), record(batch=batch).to_fields(), id=f"{ms}-0")
    assert [r.batch for r in read_progress(redis_conn, job, start_s=1.5)] == [2, 3]
    assert [r.batch for r in read_progress(redis_conn, job, end_s=2.0)] == [1, 2]
    assert [r.batch for r in read_progress(redis_conn, job, 1.0, 3.0, count=2)] == [1, 2]


class _JsonOnly:
    """A JVM progress event as spark_runtime.listener reads it: only `progress().json()`."""

    def __init__(self, progress: dict):
        self._text = json.dumps(progress)

    def progress(self):
        return self

    def json(self):
        return self._text


def test_a_progress_event_read_from_json_takes_a_left_out_rate_as_nan():
    """Spark leaves a source's non-finite rates out of the JSON; the event still arrives, with
    NaN there (as PySpark's own bridge gives it) and every other figure as sent."""
    source = {"description": "redis_stream", "startOffset": None, "endOffset": {"id": "5-0"},
              "latestOffset": {"id": "5-0"}, "numInputRows": 3, "metrics": {}}  # fmt: skip
    sent = {
        "id": "8f9a7c8e-0000-4000-8000-000000000001",
        "runId": "8f9a7c8e-0000-4000-8000-000000000002",
        "name": "t1.all.primary.0",
        "timestamp": "2026-11-27T19:00:00.000Z",
        "batchId": 4,
        "batchDuration": 173,
        "numInputRows": 3,
        "durationMs": {"addBatch": 147, "walCommit": 8},
        "stateOperators": [],
        "sources": [source],
        "sink": {"description": "ForeachBatchSink", "numOutputRows": -1, "metrics": {}},
    }
    progress = progress_event(_JsonOnly(sent)).progress
    assert (progress.batchId, progress.numInputRows, progress.batchDuration) == (4, 3, 173)
    assert progress.durationMs == {"addBatch": 147, "walCommit": 8}
    (read,) = progress.sources
    assert read.numInputRows == 3
    assert math.isnan(read.inputRowsPerSecond) and math.isnan(read.processedRowsPerSecond)
