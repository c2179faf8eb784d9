"""The Redis stream reader's offset planning and validation, called directly (no Spark)."""

from __future__ import annotations

import itertools

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from spark_runtime import keys, redis_source
from spark_runtime.redis_source import RedisStreamReader, parse_fields


def make_reader(redis_url, job, **options):
    opts = {"stream": keys.input_stream(job), "redisUrl": redis_url, "job": job, "stage": "s"}
    opts.update({k: str(v) for k, v in options.items()})
    return RedisStreamReader(opts, parse_fields("text"))


def fill(client, job, n):
    pipe = client.pipeline()
    for i in range(n):
        pipe.xadd(keys.input_stream(job), {"id": f"e{i}", "ts": str(1000 + i), "text": f"w{i}"})
    return pipe.execute()


def test_offsets_respect_the_read_limit_and_partition_large_ranges(redis_conn, job, redis_url):
    ids = fill(redis_conn, job, 25)
    reader = make_reader(redis_url, job, maxRecordsPerBatch=10, partitionSize=4)
    start = reader.initialOffset()
    assert start == {"id": "0-0"}
    assert reader.getDefaultReadLimit() == ReadMaxRows(10)
    end = reader.latestOffset(start, ReadMaxRows(10))
    assert end == {"id": ids[9]}
    parts = reader.partitions(start, end)
    assert [(p.start, p.end) for p in parts] == [
        ("0-0", ids[3]),
        (ids[3], ids[7]),
        (ids[7], ids[9]),
    ]
    rows = [row for p in parts for row in reader.read(p)]
    assert [r[2] for r in rows] == [f"e{i}" for i in range(10)]
    assert reader.latestOffset(end, ReadAllAvailable()) == {"id": ids[-1]}
    # Nothing new: the start offset comes back unchanged.
    assert reader.latestOffset({"id": ids[-1]}, ReadMaxRows(10)) == {"id": ids[-1]}
    assert reader.partitions(end, end) == []


def test_a_paced_reader_reads_new_input_once_per_pace(redis_conn, job, redis_url, monkeypatch):
    """While the replica's pace key holds N seconds, new input is read at most every N s
    (Spark runs no batch when latestOffset returns the start); without it, on every call."""
    clock = [1000.0]
    monkeypatch.setattr(redis_source.time, "monotonic", lambda: clock[0])
    pace = keys.batch_pace(job, "r-2")
    ids = fill(redis_conn, job, 3)
    reader = make_reader(redis_url, job, paceKey=pace)
    redis_conn.set(pace, "1.5", px=10_000)
    first = reader.latestOffset(reader.initialOffset(), ReadMaxRows(100))
    assert first == {"id": ids[-1]}  # nothing read yet: the first call reads
    more = fill(redis_conn, job, 2)
    clock[0] += 1.4
    assert reader.latestOffset(first, ReadMaxRows(100)) == first  # paced: no batch
    clock[0] += 0.2
    assert reader.latestOffset(first, ReadMaxRows(100)) == {"id": more[-1]}
    # A read cut short by the limit is not paced: the next call reads on at once.
    rest = fill(redis_conn, job, 5)
    clock[0] += 1.6
    assert reader.latestOffset({"id": more[-1]}, ReadMaxRows(2)) == {"id": rest[1]}
    assert reader.latestOffset({"id": rest[1]}, ReadMaxRows(2)) == {"id": rest[3]}
    assert reader.latestOffset({"id": rest[3]}, ReadMaxRows(2)) == {"id": rest[4]}
    assert reader.latestOffset({"id": rest[4]}, ReadMaxRows(2)) == {"id": rest[4]}  # paced
    # The pace is lifted (a promotion, or the key's TTL ran out): every call reads.
    newest = fill(redis_conn, job, 1)
    redis_conn.delete(pace)
    assert reader.latestOffset({"id": rest[4]}, ReadMaxRows(100)) == {"id": newest[-1]}
    # Another replica's pace is not this one's.
    redis_conn.set(keys.batch_pace(job, "r-3"), "60", px=10_000)
    last = fill(redis_conn, job, 1)
    assert reader.latestOffset({"id": newest[-1]}, ReadMaxRows(100)) == {"id": last[-1]}


def server_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


ADDED = itertools.count()  # record ids unique across calls within one millisecond


def add_at(client, job, ms: int, n: int = 1) -> list[str]:
    """`n` entries with ids at `ms` (the server's clock in an entry id: its arrival time). The
    server numbers them within the millisecond (`ms-*`): an earlier call may have taken the
    same millisecond."""
    pipe = client.pipeline()
    for _ in range(n):
        fields = {"id": f"a{ms}-{next(ADDED)}", "ts": str(ms), "text": "w"}
        pipe.xadd(keys.input_stream(job), fields, id=f"{ms}-*")
    return pipe.execute()


def test_light_input_is_held_until_its_oldest_entry_waited_the_bound(
    redis_conn, job, redis_url, monkeypatch
):
    """With lightInputWaitS, fewer than LIGHT_INPUT_RECORDS waiting entries make no batch until
    the oldest of them waited that long (or the last batch is that old); without it, and with
    heavy input, every call reads."""
    clock = [1000.0]
    monkeypatch.setattr(redis_source.time, "monotonic", lambda: clock[0])
    now = server_ms(redis_conn)
    fresh = add_at(redis_conn, job, now - 500, 3)
    plain = make_reader(redis_url, job)
    assert plain.latestOffset(plain.initialOffset(), ReadMaxRows(100)) == {"id": fresh[-1]}
    held = make_reader(redis_url, job, lightInputWaitS=2)
    start = held.initialOffset()
    assert held.latestOffset(start, ReadMaxRows(100)) == start  # 0.5 s old: held
    redis_conn.delete(keys.input_stream(job))
    add_at(redis_conn, job, now - 2500)
    fresh = add_at(redis_conn, job, now - 100, 2)
    assert held.latestOffset(start, ReadMaxRows(100)) == {"id": fresh[-1]}  # 2.5 s old: read
    clock[0] += 0.5
    # Nothing waiting: no batch either way.
    assert held.latestOffset({"id": fresh[-1]}, ReadMaxRows(100)) == {"id": fresh[-1]}
    # Heavy input is not held: LIGHT_INPUT_RECORDS entries waiting are read at once.
    heavy = add_at(redis_conn, job, server_ms(redis_conn), redis_source.LIGHT_INPUT_RECORDS)
    assert held.latestOffset({"id": fresh[-1]}, ReadMaxRows(10_000)) == {"id": heavy[-1]}


def test_a_lifted_pace_reads_at_once_then_holds_light_input(
    redis_conn, job, redis_url, monkeypatch
):
    """A promotion lifts the standby's pace: its next trigger reads what waits, held or not;
    light input after that is held again."""
    clock = [1000.0]
    monkeypatch.setattr(redis_source.time, "monotonic", lambda: clock[0])
    pace = keys.batch_pace(job, "r-2")
    redis_conn.set(pace, "6", px=10_000)
    reader = make_reader(redis_url, job, paceKey=pace, lightInputWaitS=2)
    first = add_at(redis_conn, job, server_ms(redis_conn) - 100)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadMaxRows(100)) == {"id": first[-1]}
    clock[0] += 1.0
    fresh = add_at(redis_conn, job, server_ms(redis_conn))
    assert reader.latestOffset({"id": first[-1]}, ReadMaxRows(100)) == {"id": first[-1]}  # paced
    redis_conn.delete(pace)  # promoted
    clock[0] += 0.3
    assert reader.latestOffset({"id": first[-1]}, ReadMaxRows(100)) == {"id": fresh[-1]}
    clock[0] += 0.3
    light = add_at(redis_conn, job, server_ms(redis_conn))
    assert reader.latestOffset({"id": fresh[-1]}, ReadMaxRows(100)) == {"id": fresh[-1]}  # held
    clock[0] += 2.0
    assert reader.latestOffset({"id": fresh[-1]}, ReadMaxRows(100)) == {"id": light[-1]}


def test_held_input_is_read_once_the_last_batch_is_as_old_as_the_bound(
    redis_conn, job, redis_url, monkeypatch
):
    """Entry ids ahead of the server's clock (a user's own ids) are held at most the bound
    after the last batch: the reader's own clock ends the hold."""
    clock = [1000.0]
    monkeypatch.setattr(redis_source.time, "monotonic", lambda: clock[0])
    reader = make_reader(redis_url, job, lightInputWaitS=1.5)
    ahead = add_at(redis_conn, job, server_ms(redis_conn) + 60_000)
    start = reader.initialOffset()
    clock[0] += 1.4
    assert reader.latestOffset(start, ReadMaxRows(100)) == start
    clock[0] += 0.1
    assert reader.latestOffset(start, ReadMaxRows(100)) == {"id": ahead[-1]}
    more = add_at(redis_conn, job, server_ms(redis_conn) + 61_000)
    clock[0] += 1.0
    assert reader.latestOffset({"id": ahead[-1]}, ReadMaxRows(100)) == {"id": ahead[-1]}
    clock[0] += 0.5
    assert reader.latestOffset({"id": ahead[-1]}, ReadMaxRows(100)) == {"id": more[-1]}


def test_replay_from_any_offset_returns_the_same_rows(redis_conn, job, redis_url):
    ids = fill(redis_conn, job, 12)
    reader = make_reader(redis_url, job)
    first = [r for p in reader.partitions({"id": ids[2]}, {"id": ids[8]}) for r in reader.read(p)]
    again = [r for p in reader.partitions({"id": ids[2]}, {"id": ids[8]}) for r in reader.read(p)]
    assert first == again
    assert [r[2] for r in first] == [f"e{i}" for i in range(3, 9)]


def test_malformed_entries_go_to_the_dead_letter_stream_once(redis_conn, job, redis_url):
    stream = keys.input_stream(job)
    redis_conn.xadd(stream, {"id": "ok", "ts": "5", "text": "a b"})
    bad_ids = [
        redis_conn.xadd(stream, {"ts": "5", "text": "no id"}),
        redis_conn.xadd(stream, {"id": "x", "ts": "soon", "text": "bad ts"}),
        redis_conn.xadd(stream, {"id": "y", "ts": "5"}),
    ]
    reader = make_reader(redis_url, job)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    for _ in range(2):  # a replayed batch must not dead-letter twice
        rows = [r for p in reader.partitions(reader.initialOffset(), end) for r in reader.read(p)]
        assert [r[2] for r in rows] == ["ok"]
    dead = redis_conn.xrange(keys.dead_letters(job))
    assert [f["entry"] for _, f in dead] == bad_ids
    assert [f["reason"] for _, f in dead] == [
        "missing id",
        "ts is not an integer: 'soon'",
        "missing field text",
    ]
    assert {f["stage"] for _, f in dead} == {"s"}
    assert redis_conn.hget(keys.stats(job), "dead:s") == "3"
