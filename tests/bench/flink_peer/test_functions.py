"""The plain-Python parts of the Flink peer's job: parsing against the benchmark's ground truth,
and the result writer against a real Redis (results hash, progress records, the fault flag)."""

import json
import time
from collections import Counter

import pytest

from bench.flink_peer.functions import InjectedTaskFailure, ResultWriter, split_line, window_item
from console.policy import truth
from spark_runtime import keys
from spark_runtime.generators import generate
from spark_runtime.progress import read_progress


def input_lines(redis_conn, job):
    """The bridged form of the job's input: one JSON object per stream entry."""
    return [json.dumps(fields) for _, fields in redis_conn.xrange(keys.input_stream(job))]


def test_split_line_counts_what_the_ground_truth_counts(redis_conn, job):
    generate(redis_conn, job, "wordcount", count=300, rate=100_000, seed=11)
    lines = input_lines(redis_conn, job)
    words = [w for line in lines for w in split_line(line)]
    assert dict(Counter(word for word, _, _ in words)) == truth.wordcount_cells(
        [json.loads(line) for line in lines]
    )
    # The first word of each line carries the line: they count the input events.
    assert sum(first for _, _, first in words) == len(lines)


def test_window_item_puts_events_in_the_ground_truths_windows(redis_conn, job):
    generate(redis_conn, job, "topn", count=200, rate=100_000, seed=2)
    entries = [json.loads(line) for line in input_lines(redis_conn, job)]
    counted = Counter(
        (window, item) for window, item, _ in (window_item(json.dumps(e), 10_000) for e in entries)
    )
    expected = truth.top_items_per_window(entries, 10, 50)  # every item: n = all 50
    assert {(w, i): c for w, top in expected.items() for i, c in top} == dict(counted)


def test_writer_upserts_results_and_publishes_progress(redis_conn, job, redis_url):
    writer = ResultWriter(redis_url, job, "count", subtask=0)
    now_ms = int(time.time() * 1000)
    writer.upsert("w001", "3", now_ms - 400, events=1)
    writer.upsert("w002", "1", now_ms - 200, events=0)
    writer.upsert("w001", "4", now_ms - 100, events=1)
    writer.flush(time.time())
    assert redis_conn.hgetall(keys.results(job)) == {"w001": "4", "w002": "1"}
    (record,) = read_progress(redis_conn, job)
    assert (record.stage, record.replica, record.segment) == ("flink", "flink/count/0", "0")
    assert record.is_output and record.input_rows == 2 and record.written == 3
    assert 0.1 <= record.latency_p50 < 0.3 + 1.0
    assert 0.4 <= record.latency_p99 < 0.4 + 1.0
    writer.flush(time.time())  # nothing written since: no record
    assert len(read_progress(redis_conn, job)) == 1


def test_writer_raises_once_when_the_task_fault_flag_is_set(redis_conn, job, redis_url):
    writer = ResultWriter(redis_url, job, "topn", subtask=1)
    redis_conn.set(keys.flink_task_fault(job), "1")
    writer.upsert("0", "[]", int(time.time() * 1000), events=1)
    with pytest.raises(InjectedTaskFailure, match="topn/1"):
        writer.flush(time.time())
    assert redis_conn.get(keys.flink_task_fault(job)) is None
    writer.flush(time.time())  # taken once: the restarted task runs on
