"""How far a hot standby is behind its primary, and when it may be promoted (real Redis)."""

from __future__ import annotations

from spark_runtime import keys
from spark_runtime.runtime import OutputGate, lag_behind, version_ms
from spark_runtime.sink import StreamRecord, version

MS = 1_700_000_000_000  # an input entry time, epoch ms


def at(ms: int, seq: int = 0, k: int = 0) -> str:
    return version(ms * 1_000_000 + seq, k)


def test_version_ms_reads_the_entry_time_back():
    assert version_ms(at(MS, seq=7, k=3)) == MS


def test_lag_is_the_primary_watermark_minus_the_standbys_newest_output():
    batch = {"results": [StreamRecord(at(MS + 1000), {}), StreamRecord(at(MS + 4000), {})]}
    # Primary has written up to MS + 10 s; the standby's newest output is MS + 4 s: 6 s behind.
    assert lag_behind({"results": at(MS + 10_000)}, batch) == 6.0
    # Ahead of the primary counts as caught up, not as a negative lag.
    assert lag_behind({"results": at(MS + 2000)}, batch) == 0.0
    # Nothing written by the primary to this sink yet: no measure.
    assert lag_behind({"other": at(MS)}, batch) is None


def test_standby_is_caught_up_at_job_start_and_then_by_its_lag(redis_conn, job):
    gate = OutputGate(redis_conn, job, "count", "standby")
    assert gate.caught_up(5.0)  # no batch, and the primary has written nothing yet
    redis_conn.hset(keys.watermarks(job, "count"), "results", at(MS))
    assert not gate.caught_up(5.0)  # the primary has output, the standby has shown nothing
    gate.query_lag_s["count.standby.0"] = 2.0
    assert gate.caught_up(5.0)
    gate.query_lag_s["count.standby.0"] = 12.0
    assert not gate.caught_up(5.0)
    # A second query that is behind holds the stage back; once idle, it has read all the input.
    gate.query_lag_s["count.standby.0"] = 1.0
    gate.query_lag_s["count.standby.1"] = 30.0
    assert gate.standby_lag_s == 30.0 and not gate.caught_up(5.0)
    gate.note_idle("count.standby.1")
    assert gate.standby_lag_s == 1.0 and gate.caught_up(5.0)


def test_a_seeded_standby_with_no_new_input_is_caught_up_once_idle(redis_conn, job):
    gate = OutputGate(redis_conn, job, "count", "standby")
    redis_conn.hset(keys.watermarks(job, "count"), "results", at(MS))
    assert not gate.caught_up(5.0)
    gate.note_idle("count.standby.0")
    assert gate.caught_up(5.0)


def test_a_demotion_waits_for_a_batch_or_its_time_and_a_promotion_cancels_it(redis_conn, job):
    # An upgrade's old version: the demotion asked for is carried out after its next batch
    # (tests/spark_runtime/test_topologies.py), or here, without one, once overdue.
    gate = OutputGate(redis_conn, job, "count", "primary")
    done = []
    gate.demote_after_batch(done.append)
    gate.demote_if_overdue(60.0)
    assert gate.role == "primary" and done == []
    gate.demote_if_overdue(0.0)
    assert gate.role == "standby" and gate.handed_over and len(done) == 1
    assert "watermarks" in done[0]
    # A rollback before the hand-over: the promotion cancels a demotion not yet carried out.
    other = OutputGate(redis_conn, job, "count", "primary")
    cancelled = []
    other.demote_after_batch(cancelled.append)
    other.promote()
    other.demote_if_overdue(0.0)
    assert other.role == "primary" and cancelled == []
