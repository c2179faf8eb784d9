"""The Redis-stream-to-files bridge of the Flink peer, on a real Redis stream written by the
real generator; expectations come from reading the stream back with XRANGE."""

import json
import threading
import time

from bench.flink_peer.bridge import (
    bridge_delays,
    bridge_once,
    file_name,
    last_bridged_id,
    run_bridge,
)
from spark_runtime import keys
from spark_runtime.generators import generate


def bridged_entries(directory):
    """Every entry in the directory's complete files, in file-name order."""
    lines = []
    for path in sorted(p for p in directory.glob("*.jsonl") if not p.name.startswith(".")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def test_file_names_sort_as_stream_ids():
    ids = ["999-5", "1000-0", "1000-12", "1000-2", "10000-0"]
    by_name = sorted(ids, key=file_name)
    by_id = sorted(ids, key=lambda i: tuple(int(part) for part in i.split("-")))
    assert by_name == by_id


def test_bridge_copies_each_entry_once_in_order_and_resumes(redis_conn, job, tmp_path):
    generate(redis_conn, job, "wordcount", count=40, rate=10_000, seed=3)
    after, copied = bridge_once(redis_conn, job, tmp_path, "0-0", block_ms=100)
    assert copied == 40
    generate(redis_conn, job, "wordcount", count=70, rate=10_000, seed=3, resume=True)
    # A restarted bridge goes on after the newest complete file; a half-written file (hidden,
    # as the bridge writes it before the rename) is not looked at.
    (tmp_path / ".000000000000001-000000.jsonl.tmp").write_text('{"_stream_id": "9-9"}\n')
    assert last_bridged_id(tmp_path) == after
    after, copied = bridge_once(redis_conn, job, tmp_path, last_bridged_id(tmp_path), block_ms=100)
    assert copied == 30
    assert bridge_once(redis_conn, job, tmp_path, after, block_ms=50) == (after, 0)

    stream = redis_conn.xrange(keys.input_stream(job))
    bridged = bridged_entries(tmp_path)
    assert [entry.pop("_stream_id") for entry in bridged] == [sid for sid, _ in stream]
    assert bridged == [fields for _, fields in stream]
    assert len(list(tmp_path.glob("*.jsonl"))) == 2


def test_run_bridge_follows_the_stream_until_stopped(redis_conn, job, tmp_path):
    stop = threading.Event()
    counted = []
    bridge = threading.Thread(
        target=lambda: counted.append(run_bridge(redis_conn, job, tmp_path, stop=stop.is_set))
    )
    bridge.start()
    generate(redis_conn, job, "topn", count=60, rate=300, seed=5)
    deadline = time.time() + 10
    while len(bridged_entries(tmp_path)) < 60 and time.time() < deadline:
        time.sleep(0.05)
    stop.set()
    bridge.join(timeout=5)
    assert counted == [60]
    assert [e["id"] for e in bridged_entries(tmp_path)] == [
        fields["id"] for _, fields in redis_conn.xrange(keys.input_stream(job))
    ]
    delays = bridge_delays(tmp_path)
    assert len(delays) == 60
    # Each entry waited from its generation until its file was complete: never negative, and
    # well under a second on a quiet bridge.
    assert all(-0.01 <= d < 1.5 for d in delays), max(delays)
