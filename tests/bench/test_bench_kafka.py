"""`manage.py bench --source redis|kafka --trigger microbatch|realtime` (issue 56): the options,
the runs' `source` and `trigger` in bench.json and bench.md, the refusal of real-time mode, and
the audit of a run's output topic against the reference from its input topic, on a real broker
with records of known content (the expected counts worked out by hand below)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from django.core.management import call_command
from django.core.management.base import CommandError

from bench.management.commands import bench as bench_command
from bench.strategy import report
from bench.strategy.harness import BenchSettings
from bench.strategy.run import TopicAuditor, broker_figures, job_io, source_keys
from bench.strategy.topics import audit, audit_topics, read_output, run_topics
from console.services.jobs import REALTIME_REFUSAL
from infra.kafka_outage import UP, Outage
from spark_runtime import keys as data_keys
from spark_runtime.jobdef import registered_path, snapshot_source
from spark_runtime.progress import ProgressRecord
from tests.factories import make_job

ROOT = Path(__file__).resolve().parents[2]
REASON = REALTIME_REFUSAL.removeprefix("trigger: ")


def version(n: int) -> str:
    """An output version as the sinks write them (26 digits, compared as strings)."""
    return f"{n:026d}"


class Message:
    """A consumed record, as confluent_kafka gives it (what the audit reads of one)."""

    def __init__(self, value, partition=0, offset=0, timestamp_ms=0):
        self._value = value if isinstance(value, bytes) else json.dumps(value).encode()
        self._partition, self._offset, self._ts = partition, offset, timestamp_ms

    def value(self):
        return self._value

    def partition(self):
        return self._partition

    def offset(self):
        return self._offset

    def timestamp(self):
        return (1, self._ts)  # TIMESTAMP_CREATE_TIME


def inputs(*values) -> list[Message]:
    """Input records, one offset each; a dict value's `ts` is also the record's timestamp (the
    generator sets both)."""
    return [
        Message(v, offset=i, timestamp_ms=v.get("ts", 0) if isinstance(v, dict) else 0)
        for i, v in enumerate(values)
    ]


def results(*rows) -> list[Message]:
    """Output records of hash results: (key, value, version number)."""
    return [
        Message({"key": key, "value": value, "version": version(n)}, offset=i)
        for i, (key, value, n) in enumerate(rows)
    ]


# --- the options ------------------------------------------------------------------------------


def test_source_and_trigger_default_to_redis_and_micro_batches():
    bench = BenchSettings(
        topology="wordcount", strategies=("adaptive",), faults=1, fault_kind="kill-driver",
        rate=50.0, warmup_s=20.0, duration_s=60.0, out=Path("."),
    )  # fmt: skip
    assert (bench.source, bench.trigger) == ("redis", "microbatch")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ((), ("redis", "microbatch")),
        (("--source", "kafka"), ("kafka", "microbatch")),
        (("--source", "redis", "--trigger", "microbatch"), ("redis", "microbatch")),
    ],
)
def test_the_command_gives_the_runs_its_source_and_trigger(
    monkeypatch, tmp_path, options, expected
):
    given = []

    def run_bench(bench, say):
        given.append(bench)
        return {"settings": {"topology": bench.topology}, "runs": []}

    monkeypatch.setattr(bench_command, "run_bench", run_bench)
    monkeypatch.setattr(bench_command, "call_command", lambda *args, **kwargs: None)  # migrate
    call_command("bench", "--quick", *options, "--out", str(tmp_path))
    (bench,) = given
    assert (bench.source, bench.trigger) == expected
    assert bench.strategies == ("restart-all", "adaptive")  # --quick's


def test_realtime_is_refused_with_the_reason_before_anything_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_command, "run_bench", lambda *a: pytest.fail("must not run"))
    with pytest.raises(CommandError) as refused:
        call_command("bench", "--source", "kafka", "--trigger", "realtime", "--out", str(tmp_path))
    assert refused.value.returncode == 2
    assert str(refused.value) == f"--trigger realtime is refused: {REASON}"


def test_realtime_exits_with_status_2_and_says_why(tmp_path, settings):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "web.settings.local",
        "BACKSTOP_VAR_DIR": str(tmp_path / "var"),
        "REDIS_URL": settings.REDIS_URL,
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "bench", "--trigger", "realtime", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--trigger realtime is refused: Spark's real-time mode reads Kafka only" in done.stderr
    assert "which Maven Central does not serve" in done.stderr
    assert not (tmp_path / "bench.json").exists()


def test_a_run_on_kafka_gets_an_input_and_an_output_topic_of_its_own():
    bench = BenchSettings(
        topology="wordcount", strategies=("adaptive",), faults=0, fault_kind="kill-driver",
        rate=50.0, warmup_s=20.0, duration_s=60.0, out=Path("."), source="kafka",
    )  # fmt: skip
    io, topics = job_io(bench, "adaptive")
    assert topics[0].startswith("bench.wordcount.adaptive.") and topics[0].endswith(".in")
    assert topics[1] == topics[0].removesuffix(".in") + ".out"
    assert io == {
        "source": {"kind": "kafka", "topic": topics[0]},
        "sink": {"kind": "kafka", "topic": topics[1]},
    }
    assert job_io(dataclasses.replace(bench, source="redis"), "adaptive") == ({}, None)
    # A registered job's NAME@VERSION: '@' is no topic character.
    assert run_topics("activity@1", "restart-all", "20261128-130000") == (
        "bench.activity-1.restart-all.20261128-130000.in",
        "bench.activity-1.restart-all.20261128-130000.out",
    )


# --- the output topic's audit -----------------------------------------------------------------


def test_wordcount_newest_counts_against_the_input_and_pairs_read_twice():
    # Input: apple 3, banana 2, cherry 1 (upper case counts as lower case); the value that is
    # not JSON is a dead letter, left out.
    messages = inputs(
        {"id": "e0", "ts": 1000, "text": "apple banana apple"},
        {"id": "e1", "ts": 1001, "text": "Banana cherry"},
        b"not json",
        {"id": "e2", "ts": 1002, "text": "apple"},
    )
    output = results(
        ("apple", "2", 1), ("banana", "1", 1),  # older versions: replaced below
        ("apple", "3", 3), ("banana", "2", 3),
        ("banana", "2", 3),  # the same (key, version) again: 1 duplicate
        ("cherry", "2", 4),  # one over: 1 duplicate
        ("fig", "1", 4),  # not in the input: 1 duplicate
    )  # fmt: skip
    found = audit("wordcount", {}, messages, output)
    assert found.expected == {"apple": 3, "banana": 2, "cherry": 1}
    assert found.actual == {"apple": 3, "banana": 2, "cherry": 2, "fig": 1}
    assert (found.comparison.lost, found.comparison.duplicates) == (0, 3)
    assert (found.comparison.cells, found.comparison.wrong_cells) == (3, 2)
    assert (found.input_records, found.output_records, found.repeated) == (4, 7, 1)
    # The newest version wins whatever the order read (partitions interleave).
    assert read_output(list(reversed(output))).newest["apple"] == "3"


def test_topn_cells_of_the_newest_window_values():
    # Items a, a, b in the window starting at 0 s and c in the one at 10 s (window 10 s, top 2).
    messages = inputs(
        {"id": "e0", "ts": 1000, "item": "a"},
        {"id": "e1", "ts": 2000, "item": "b"},
        {"id": "e2", "ts": 3000, "item": "a"},
        {"id": "e3", "ts": 12000, "item": "c"},
    )
    output = results(
        ("0", json.dumps([["a", 1]]), 1),
        ("0", json.dumps([["a", 2], ["b", 1]]), 2),
        # Window 10 s lacks c: 1 lost.
    )
    found = audit("topn", {"window_seconds": 10, "n": 2}, messages, output)
    assert found.expected == {"0|a": 2, "0|b": 1, "10000|c": 1}
    assert (found.comparison.lost, found.comparison.duplicates, found.repeated) == (1, 0, 0)


@pytest.fixture
def example_jobs(tmp_path, monkeypatch):
    """The example user jobs registered as version 1 in a jobs directory of the test's own."""
    shutil.copytree(ROOT / "jobs" / "examples", tmp_path / "examples")
    for name in ("activity", "server_errors"):
        path = registered_path(name, 1, tmp_path)
        path.parent.mkdir(parents=True)
        path.write_text(snapshot_source(f"examples.clickstream:{name}", tmp_path))
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(tmp_path))
    return tmp_path


# 1700000000 s is 2023-11-14T22:13:20Z: the 10-second window of the clicks below.
T = 1_700_000_000_000
WINDOW = "2023-11-14T22:13:20.000Z"
CLICKS = (
    {"id": "c1", "ts": T + 1000, "user": "u01", "page": "home", "dwell_ms": 100, "status": 200},
    {"id": "c2", "ts": T + 5000, "user": "u01", "page": "cart", "dwell_ms": 300, "status": 200},
    {"id": "c3", "ts": T + 2000, "user": "u02", "page": "help", "dwell_ms": 50, "status": 503},
    {"id": "c4", "ts": T + 3000, "user": "u01", "page": "", "dwell_ms": 900, "status": 200},
)


def test_a_user_job_that_upserts_is_judged_key_by_key(example_jobs):
    # activity: c4 has no page (filtered), so u01 has 2 clicks (100 + 300 ms), u02 one (50 ms).
    u01, u02 = f"u01|{WINDOW}", f"u02|{WINDOW}"
    output = results(
        (u01, json.dumps({"clicks": 1, "dwell_ms": 100, "longest_ms": 100}), 1),
        (u01, json.dumps({"clicks": 2, "dwell_ms": 400, "longest_ms": 300}), 2),
        (u02, json.dumps({"clicks": 1, "dwell_ms": 50, "longest_ms": 50}), 2),
        (u02, json.dumps({"clicks": 1, "dwell_ms": 50, "longest_ms": 50}), 2),  # again
    )
    found = audit("activity@1", {}, inputs(*CLICKS), output)
    assert found.expected == {
        u01: {"clicks": 2, "dwell_ms": 400, "longest_ms": 300},
        u02: {"clicks": 1, "dwell_ms": 50, "longest_ms": 50},
    }
    assert (found.comparison.lost, found.comparison.duplicates) == (0, 1)
    assert found.comparison.wrong_cells == 0
    # Without u02's records: 1 lost.
    assert audit("activity@1", {}, inputs(*CLICKS), output[:2]).comparison.lost == 1


def test_a_user_job_that_appends_counts_a_key_written_twice_once(example_jobs):
    # server_errors: c3 is the only 5xx; it is on the topic twice (two batches wrote it).
    record = {"key": "c3", "user": "u02", "page": "help", "status": "503",
              "event_time": "2023-11-14T22:13:22.000Z"}  # fmt: skip
    output = [
        Message({**record, "version": version(1)}, offset=0),
        Message({**record, "version": version(2)}, offset=1),
    ]
    found = audit("server_errors@1", {}, inputs(*CLICKS), output)
    assert found.expected == {"c3": {k: v for k, v in record.items() if k != "key"}}
    assert (found.comparison.lost, found.comparison.duplicates, found.repeated) == (0, 1, 0)
    assert audit("server_errors@1", {}, inputs(*CLICKS), []).comparison.lost == 1


@pytest.fixture
def run_topics_on_broker(kafka_broker):
    """A 3-partition input topic and a 2-partition output topic, as a launch creates them."""
    bootstrap = kafka_broker.bootstrap_servers
    names = run_topics("wordcount", "adaptive", os.urandom(4).hex())
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(names[0], 3, 1), NewTopic(names[1], 2, 1)])
    for future in created.values():
        future.result(30)
    return bootstrap, names


def transaction(producer: Producer, topic: str, records: list[tuple[str, dict]], commit: bool):
    producer.begin_transaction()
    for key, value in records:
        producer.produce(topic, key=key, value=json.dumps(value))
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)
        producer.abort_transaction(30)


def test_the_output_topic_is_audited_as_a_read_committed_reader_sees_it(run_topics_on_broker):
    bootstrap, (input_topic, output_topic) = run_topics_on_broker
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"audit-{output_topic}"}
    )
    producer.init_transactions(30)
    # Input: apple 3, banana 2, cherry 1, date 1; "zebra" is in an aborted transaction.
    lines = ["apple banana apple", "banana cherry", "Apple date"]
    transaction(producer, input_topic, [
        (f"e{i}", {"id": f"e{i}", "ts": 1000 + i, "text": text}) for i, text in enumerate(lines)
    ], commit=True)  # fmt: skip
    transaction(producer, input_topic, [("e9", {"id": "e9", "ts": 1009, "text": "zebra"})],
                commit=False)  # fmt: skip

    def row(word, count, n):
        return word, {"key": word, "value": str(count), "version": version(n)}

    transaction(producer, output_topic, [row("apple", 2, 1), row("banana", 1, 1),
                                         row("cherry", 1, 2)], commit=True)  # fmt: skip
    # banana at version 1 once more: a duplicate; apple at its newest count.
    transaction(producer, output_topic, [row("apple", 3, 3), row("banana", 1, 1)], commit=True)
    # Aborted: never seen, so date is lost and banana stays 1 short.
    transaction(producer, output_topic, [row("date", 1, 4), row("banana", 2, 5)], commit=False)
    transaction(producer, output_topic, [row("zebra", 1, 6)], commit=True)  # not in the input
    producer.flush(30)

    found = audit_topics(bootstrap, "wordcount", {}, input_topic, output_topic)
    assert found.expected == {"apple": 3, "banana": 2, "cherry": 1, "date": 1}
    assert found.actual == {"apple": 3, "banana": 1, "cherry": 1, "zebra": 1}
    # lost: banana 1 + date 1; duplicates: zebra 1 + (banana, version 1) read twice 1.
    assert (found.comparison.lost, found.comparison.duplicates) == (2, 2)
    assert (found.comparison.cells, found.comparison.wrong_cells) == (4, 3)
    assert (found.input_records, found.output_records, found.repeated) == (3, 6, 1)


# --- bench.json and bench.md ------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_flushed")
def test_bench_json_says_where_each_run_read_and_was_audited(redis_conn):
    base = {
        "topology": "wordcount", "strategies": ("adaptive",), "faults": 1,
        "fault_kind": "kill-driver", "rate": 50.0, "warmup_s": 20.0, "duration_s": 60.0,
        "out": Path("."),
    }  # fmt: skip
    job = make_job()
    redis_conn.xadd(data_keys.input_stream(job.key), {"id": "e0", "ts": "1", "text": "a b"})
    assert source_keys(BenchSettings(**base), redis_conn, job, None) == {
        "source": "redis", "trigger": "microbatch", "audited": "redis results", "input_events": 1,
    }  # fmt: skip

    # On Kafka: the output topic's audit, and Redis's results against the same reference.
    auditor = TopicAuditor("127.0.0.1:9", "wordcount", {}, ("t.in", "t.out"))
    auditor.last = audit(
        "wordcount", {}, inputs({"id": "e0", "ts": 1, "text": "a b a"}),
        results(("a", "2", 1), ("b", "1", 1), ("b", "1", 1)),
    )  # fmt: skip
    redis_conn.hset(data_keys.results(job.key), mapping={"a": "1", "b": "1"})  # a: 1 short
    keys = source_keys(BenchSettings(**base, source="kafka"), redis_conn, job, auditor)
    assert keys == {
        "source": "kafka",
        "trigger": "microbatch",
        "audited": "output topic",
        "input_events": 1,
        "kafka": {
            "bootstrap_servers": "127.0.0.1:9",
            "input_topic": "t.in",
            "output_topic": "t.out",
            "output_records": 3,
            "repeated": 1,
            "redis_results": {"lost": 1, "duplicates": 0, "wrong_cells": 1},
        },
    }
    json.dumps(keys)  # as written to bench.json


def test_bench_md_shows_each_runs_source_and_trigger():
    steady = {"p50_ms": 400.0, "p99_ms": 900.0, "throughput_eps": 50.0, "cpu_pct": 100.0,
              "rss_mb": 1000.0}  # fmt: skip
    kafka = {"input_topic": "b.in", "output_topic": "b.out", "output_records": 120, "repeated": 0,
             "redis_results": {"lost": 0, "duplicates": 0, "wrong_cells": 0}}  # fmt: skip
    runs = [
        {"strategy": "restart-all", "faults": [], "lost": 0, "duplicates": 0, "steady": steady,
         "input_events": 5500},  # an older bench.json: no source, no trigger
        {"strategy": "adaptive", "faults": [], "lost": 0, "duplicates": 0, "steady": steady,
         "source": "kafka", "trigger": "microbatch", "input_events": 5500, "kafka": kafka},
    ]  # fmt: skip
    text = report.to_markdown(
        {
            "settings": {"topology": "wordcount", "source": "kafka", "trigger": "microbatch"},
            "runs": runs,
        }  # fmt: skip
    )
    assert "| strategy | source | trigger | input events | lost and dup counted on |" in text
    assert "| restart-all | redis | microbatch | 5500 | Redis results |" in text
    assert (
        "| adaptive | kafka (`b.in`) | microbatch | 5500 | output topic `b.out` (120 records, "
        "0 read twice; Redis results: lost 0, dup 0) |"
    ) in text
    assert ", source kafka, trigger microbatch." in text.splitlines()[0]
    # The RESULTS.md heading of a run on Kafka differs from the Redis run's, so neither
    # replaces the other.
    assert report.source_text({"source": "kafka", "trigger": "microbatch"}) == (
        ", source kafka, trigger microbatch"
    )
    assert report.source_text({}) == ""


# --- the broker outage as a benchmark (--fault-kind kafka-broker) ------------------------------


def broker_bench(**changes) -> BenchSettings:
    settings = dict(
        topology="wordcount", strategies=("adaptive",), faults=1, fault_kind="kafka-broker",
        rate=50.0, warmup_s=60.0, duration_s=100.0, out=Path("."), source="kafka",
    )  # fmt: skip
    return BenchSettings(**{**settings, **changes})


def test_a_broker_outage_asks_for_the_outage_length_and_needs_kafka():
    assert broker_bench().fault_params == {"duration_s": 20.0}  # the default: the goal's 20 s
    assert broker_bench(outage_s=35.0).fault_params == {"duration_s": 35.0}
    assert broker_bench(fault_kind="kill-driver").fault_params is None  # the kind's defaults
    for changes, refusal in [
        ({"source": "redis"}, "--fault-kind kafka-broker: only with --source kafka"),
        ({"peer": "flink"}, "--fault-kind kafka-broker: only with --source kafka"),
        ({"outage_s": 0.5}, "--outage: 1 to 120 s"),
        ({"outage_s": 121.0}, "--outage: 1 to 120 s"),
    ]:
        with pytest.raises(ValueError, match=refusal):
            broker_bench(**changes)


def progress(at: float, stage: str, written: int, final: bool = True) -> ProgressRecord:
    """A primary's batch as the data plane records it (only what the figures read varies)."""
    return ProgressRecord(
        replica=f"{stage}-p", stage=stage, role="primary", node="node-1", query=stage,
        segment="0", batch=int(at), at=at, input_rows=written, input_rate=None,
        processed_rate=None, batch_ms=300.0, state_rows=0, state_memory_bytes=0,
        rows_out=written, written=written, final=final, buffered=0,
    )  # fmt: skip


def test_the_broker_figures_are_its_absence_and_the_first_output_after_its_return():
    record = Outage(fault=3, job="job-1", token="t", duration_s=20.0, hard=True, state=UP,
                    down_at=1000.0, back_at=1024.5)  # fmt: skip
    records = [
        progress(999.0, "count", 10),  # before the outage
        progress(1026.0, "split", 40, final=False),  # a channel to the next stage, not output
        progress(1026.5, "count", 0),  # a batch that wrote nothing
        progress(1027.25, "count", 12),  # the first output after the return
        progress(1028.0, "count", 9),
    ]
    assert broker_figures(record, records) == {"down_s": 24.5, "output_after_return_s": 2.75}
    assert broker_figures(record, records[:3]) == {"down_s": 24.5, "output_after_return_s": None}


def test_bench_md_gives_each_broker_outage_its_own_figures():
    steady = {"p50_ms": 300.0, "p99_ms": 600.0, "throughput_eps": 50.0, "cpu_pct": 60.0,
              "rss_mb": 1200.0}  # fmt: skip
    fault = {"kind": "kafka-broker", "at_s": 110.0, "target": "count", "action": "none recorded",
             "downtime_s": 23.1, "recovery_time_s": 27.4, "peak_p99_ms": 26000.0, "note": "",
             "watched_s": 30.0,
             "broker": {"down_s": 21.3, "output_after_return_s": 1.84}}  # fmt: skip
    runs = [{"strategy": "adaptive", "faults": [fault], "lost": 0, "duplicates": 0,
             "steady": steady, "source": "kafka", "trigger": "microbatch"}]  # fmt: skip
    text = report.to_markdown({"settings": {"topology": "wordcount"}, "runs": runs})
    assert "| strategy | fault | broker away s | first output after its return s |" in text
    assert "| adaptive | 1 | 21.3 | 1.84 |" in text
    # Runs of other fault kinds have no such table.
    assert "broker away" not in report.to_markdown(
        {"settings": {}, "runs": [{**runs[0], "faults": [{**fault, "broker": None}]}]}
    )
