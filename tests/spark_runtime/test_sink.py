"""Idempotent fenced sinks (Lua scripts on the real Redis) and the standby buffer."""

from __future__ import annotations

import pytest

from spark_runtime import keys
from spark_runtime.buffer import OutputBuffer
from spark_runtime.sink import FencedError, FencedWriter, HashRow, StreamRecord, version


def records(pos_values, k=0):
    return [StreamRecord(version(p, k), {"id": f"r{p}", "ts": p}) for p in pos_values]


def test_stream_sink_skips_what_was_written_and_keeps_order(redis_conn, job):
    writer = FencedWriter(redis_conn, job, "split")
    writer.acquire()
    out = keys.channel_stream(job, "split")
    assert writer.emit_stream("split", out, records([3, 1, 2])) == 3
    # A replayed batch (partly overlapping) adds only the new records.
    assert writer.emit_stream("split", out, records([2, 3, 4, 5])) == 2
    assert [f["id"] for _, f in redis_conn.xrange(out)] == ["r1", "r2", "r3", "r4", "r5"]
    assert writer.watermark("split") == version(5)


def test_hash_sink_upserts_by_version(redis_conn, job):
    writer = FencedWriter(redis_conn, job, "count")
    writer.acquire()
    res, ver = keys.results(job), keys.result_versions(job)
    rows = [HashRow(version(10), "a", "2"), HashRow(version(12), "b", "1")]
    assert writer.upsert_hash("results", res, ver, rows) == 2
    stale = [HashRow(version(9), "a", "1"), HashRow(version(12), "b", "1")]
    assert writer.upsert_hash("results", res, ver, stale) == 0
    assert writer.upsert_hash("results", res, ver, [HashRow(version(15), "a", "3")]) == 1
    assert redis_conn.hgetall(res) == {"a": "3", "b": "1"}


def test_a_replaced_primary_is_fenced(redis_conn, job):
    old = FencedWriter(redis_conn, job, "count")
    old.acquire()
    new = FencedWriter(redis_conn, job, "count")
    new.acquire()
    res, ver = keys.results(job), keys.result_versions(job)
    with pytest.raises(FencedError):
        old.upsert_hash("results", res, ver, [HashRow(version(1), "a", "1")])
    with pytest.raises(FencedError):
        old.emit_stream("out", keys.output_stream(job), records([1]))
    assert redis_conn.exists(res, keys.output_stream(job)) == 0
    assert new.upsert_hash("results", res, ver, [HashRow(version(1), "a", "1")]) == 1


def test_buffer_trims_below_watermark_and_detects_gaps():
    buf = OutputBuffer(max_records=4)
    buf.add("s", records([1, 2, 3]))
    assert buf.trim("s", version(2)) == 1  # strictly below: version 2 may be half-written
    assert [r.version for r in buf.drain("s")] == [version(2), version(3)]
    buf.add("s", records([4, 5, 6, 7, 8, 9]))
    assert len(buf) == 4 and buf.lost_above["s"] == version(5)
    assert not buf.gap("s", version(6))
    assert buf.gap("s", version(5))
