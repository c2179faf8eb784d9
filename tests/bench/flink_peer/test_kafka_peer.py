"""The Flink peer on Kafka (`manage.py bench --source kafka --peer flink`), without Flink: the
job's arguments and Kafka settings, its output records, the connector's cache, what bench.json
records, and, on the session's real broker, the watcher of the output topic (what a
read_committed reader sees, as progress records), the input's start and the output audit with
counts worked out by hand. tests/bench/flink_peer/test_kafka_job.py runs the PyFlink job (slow).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from bench.flink_peer import connector, kafka_io
from bench.flink_peer.cluster import flink_config, flink_settings
from bench.flink_peer.functions import (
    FLUSH_S,
    TRANSACTION_TIMEOUT_MS,
    InjectedTaskFailure,
    TopicResultWriter,
    kafka_sink_properties,
    kafka_source_properties,
    result_record,
)
from bench.flink_peer.peer import job_arguments, peer_record
from bench.strategy import report
from bench.strategy.topics import read_output
from spark_runtime import keys
from spark_runtime.progress import read_progress
from tests.bench.flink_peer.test_cluster_config import fake_env
from tests.bench.test_bench_settings import settings as bench_settings

TOPICS = kafka_io.PeerTopics(
    "127.0.0.1:9092", "bench.wordcount.flink.x.in", "bench.wordcount.flink.x.out",
    "backstop-peer.flink-wordcount-120000", Path("/cache/flink-sql-connector-kafka-5.0.0-2.2.jar"),
)  # fmt: skip


def config_of(tmp_path, settings) -> dict[str, str]:
    return flink_config(fake_env(tmp_path), settings, 18081, 16123, tmp_path)


def args_of(arguments: list[str]) -> dict[str, str]:
    return dict(zip(arguments[::2], arguments[1::2], strict=True))


# --- the job's arguments and settings ---------------------------------------------------------


def test_on_kafka_the_job_gets_its_topics_prefix_and_connector_instead_of_the_bridge(tmp_path):
    settings = flink_settings("tuned")
    config = config_of(tmp_path, settings)
    args = args_of(job_arguments("wordcount", "flink-wordcount-120000", Path("in"), "redis://x",
                                 {}, settings, config, TOPICS))  # fmt: skip
    assert "--input-dir" not in args
    assert args["--source"] == "kafka"
    assert args["--bootstrap"] == "127.0.0.1:9092"
    assert (args["--input-topic"], args["--output-topic"]) == (
        "bench.wordcount.flink.x.in", "bench.wordcount.flink.x.out")  # fmt: skip
    assert args["--transactional-id-prefix"] == "backstop-peer.flink-wordcount-120000"
    assert args["--connector-jar"] == "/cache/flink-sql-connector-kafka-5.0.0-2.2.jar"
    # The rest as on Redis: the fault flag's Redis, the configuration's checkpoint interval.
    assert args["--redis-url"] == "redis://x" and args["--checkpoint-ms"] == "1000"


def test_on_redis_the_job_reads_the_bridge_as_before(tmp_path):
    settings = flink_settings()
    args = args_of(job_arguments("topn", "k", Path("in"), "redis://x", {"n": 3}, settings,
                                 config_of(tmp_path, settings)))  # fmt: skip
    assert args["--input-dir"] == "in" and args["--n"] == "3"
    assert not {"--source", "--bootstrap", "--input-topic", "--connector-jar"} & set(args)


def test_the_run_gets_topics_named_as_backstops_runs_and_a_prefix_of_its_own():
    topics = kafka_io.peer_topics("b:1", "topn", "flink-topn-101500", "20261128-101500",
                                  Path("jar.jar"))  # fmt: skip
    assert topics.input_topic == "bench.topn.flink.20261128-101500.in"
    assert topics.output_topic == "bench.topn.flink.20261128-101500.out"
    assert topics.transactional_id_prefix == "backstop-peer.flink-topn-101500"
    assert topics.connector_jar.is_absolute()


def test_the_sinks_transactions_outlive_a_checkpoint_and_a_restart_within_the_brokers_limit():
    # Kafka's broker refuses a transaction timeout over transaction.max.timeout.ms (15 min by
    # default); Flink's own default for the sink (1 h) would be refused.
    assert kafka_sink_properties() == {"transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS)}
    longest_checkpoint = flink_settings().checkpoint_ms
    assert 10 * longest_checkpoint < TRANSACTION_TIMEOUT_MS <= 15 * 60 * 1000
    assert kafka_source_properties() == {"isolation.level": "read_committed"}


# --- the output records -----------------------------------------------------------------------


def test_result_records_are_backstops_and_their_versions_order_as_strings():
    record = json.loads(result_record("w001", "12", 12, 1_700_000_000_123, 1))
    assert record == {"key": "w001", "value": "12", "version": f"{12:026d}",
                      "ts": 1_700_000_000_123, "events": 1}  # fmt: skip
    # Version 10 after version 9 (as strings, unpadded, "9" > "10").
    values = [result_record("w", str(n), n, 0, 1).encode() for n in (9, 10, 2)]
    assert read_output([Msg(v) for v in values]).newest == {"w": "10"}


class Msg:
    def __init__(self, value: bytes):
        self._value = value

    def value(self):
        return self._value


def test_the_topic_writer_returns_records_and_raises_once_on_the_fault_flag(
    redis_conn, job, redis_url
):
    writer = TopicResultWriter(redis_url, job, "count", subtask=0)
    record = writer.upsert("w003", "2", 1000, 1, version=2)
    assert json.loads(record)["version"] == f"{2:026d}"
    assert redis_conn.hgetall(keys.results(job)) == {}  # nothing in Redis
    redis_conn.set(keys.flink_task_fault(job), "1")
    writer.flushed_at = time.time() - FLUSH_S  # due: the next upsert looks at the flag
    with pytest.raises(InjectedTaskFailure, match="count/0"):
        writer.upsert("w003", "3", 1001, 1, version=3)
    assert redis_conn.get(keys.flink_task_fault(job)) is None
    assert read_progress(redis_conn, job) == []  # the watcher publishes progress, not the task
    writer.flush(time.time())  # taken once


def test_a_batch_read_from_the_output_topic_counts_events_and_latencies():
    values = [result_record("a", "1", 1, 9_000, 1), result_record("b", "1", 1, 9_500, 0)]
    batch = kafka_io.read_batch([v.encode() for v in values], at=10.0)
    assert (batch.writes, batch.events) == (2, 1)
    assert batch.latencies == [1.0, 0.5]


# --- the connector ----------------------------------------------------------------------------


def test_maven_copies_the_fat_jar_alone_and_checks_its_checksum(tmp_path):
    argv = connector.maven_argv("mvn", "5.0.0-2.2", tmp_path)
    assert "-Dartifact=org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2:jar" in argv
    assert "--strict-checksums" in argv and f"-DoutputDirectory={tmp_path}" in argv
    assert argv[3].endswith(":copy")  # copy: the artifact only, not its dependencies


def test_a_cached_connector_is_used_without_maven(tmp_path, monkeypatch):
    monkeypatch.setattr(connector.shutil, "which", lambda name: None)  # no Maven
    with pytest.raises(RuntimeError, match="apt-get install maven"):
        connector.fetch_kafka_connector(say=lambda m: None, directory=tmp_path)
    jar = connector.connector_jar(tmp_path)
    assert jar.name == "flink-sql-connector-kafka-5.0.0-2.2.jar"
    jar.write_bytes(b"PK")
    said = []
    assert connector.fetch_kafka_connector(said.append, directory=tmp_path) == jar
    assert said == []


# --- bench.json and bench.md ------------------------------------------------------------------


def test_the_peer_record_says_it_ran_on_kafka_exactly_once(tmp_path):
    settings = flink_settings()
    config = config_of(tmp_path, settings)
    status = {"state": "RUNNING", "failures": []}
    none = {"p50": None, "p99": None}
    record = peer_record(settings, config, "ab", status, none, tmp_path, TOPICS)
    assert record["source"] == "kafka"
    assert record["kafka_connector"] == "org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2"
    assert record["delivery_guarantee"] == "EXACTLY_ONCE"
    assert record["transactional_id_prefix"] == TOPICS.transactional_id_prefix
    assert (record["bridge_p50_ms"], record["bridge_p99_ms"]) == (None, None)
    assert "KafkaSink" in report.peer_io_text(record)
    on_redis = peer_record(settings, config, "ab", status, {"p50": 0.02, "p99": 0.05}, tmp_path)
    assert (on_redis["source"], on_redis["kafka_connector"]) == ("redis", None)
    assert "file bridge (p50 20 ms" in report.peer_io_text(on_redis)


def test_the_peer_is_accepted_on_kafka():
    bench = bench_settings(peer="flink", source="kafka")
    assert (bench.peer, bench.source) == ("flink", "kafka")


# --- on the session's broker ------------------------------------------------------------------


@pytest.fixture
def peer_topics(kafka_broker):
    topics = kafka_io.peer_topics(
        kafka_broker.bootstrap_servers, "wordcount", "flink-t", os.urandom(4).hex(), Path("j")
    )
    assert set(kafka_io.create_topics(topics)) == {topics.input_topic, topics.output_topic}
    assert kafka_io.create_topics(topics) == []  # created once
    return topics


def test_the_watcher_publishes_what_a_read_committed_reader_sees(peer_topics, redis_conn, job):
    bootstrap, topic = peer_topics.bootstrap, peer_topics.output_topic
    now_ms = int(time.time() * 1000)
    watcher = kafka_io.OutputWatcher(redis_conn, job, bootstrap, topic)
    watcher.start()
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{topic}"})
    producer.init_transactions(30)
    for values, commit in (
        ([("a", 1, 1, now_ms - 500), ("b", 1, 1, now_ms - 400)], True),
        ([("a", 2, 1, now_ms - 300)], False),  # aborted: never read
        ([("c", 1, 0, now_ms - 200)], True),
    ):
        producer.begin_transaction()
        for key, n, events, ts in values:
            producer.produce(topic, value=result_record(key, str(n), n, ts, events))
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    deadline = time.time() + 30
    while watcher.records < 3 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # an aborted record read late would show now
    watcher.stop()
    assert watcher.error is None
    progress = read_progress(redis_conn, job)
    assert sum(r.written for r in progress) == 3 == watcher.records
    assert sum(r.input_rows for r in progress) == 2  # the events the committed results cover
    assert all(r.stage == "flink" and r.is_output for r in progress)
    # Latency up to the read: at least how old each record's event was when it was written.
    assert max(r.latency_p99 for r in progress) >= 0.5


def test_the_input_starts_at_its_first_records_timestamp(peer_topics):
    bootstrap, topic = peer_topics.bootstrap, peer_topics.input_topic
    assert kafka_io.first_record_at(bootstrap, topic) is None
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, ts in enumerate((5_000, 3_000, 4_000, 6_000)):
        producer.produce(topic, value=b"{}", timestamp=ts, partition=i % 3)
    producer.flush(30)
    assert kafka_io.first_record_at(bootstrap, topic) == 3.0


def test_the_auditor_counts_the_peers_records_against_the_input_by_hand(peer_topics):
    """Input: x 3, y 1 (lines "x y x", "X"). The job's records: x at versions 1, 2, 3 and y at 1,
    with x's version 2 delivered twice: one duplicate, nothing lost."""
    bootstrap = peer_topics.bootstrap
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, text in enumerate(["x y x", "X"]):
        producer.produce(peer_topics.input_topic, value=json.dumps(
            {"id": f"e{i}", "ts": 1000 + i, "text": text}), timestamp=1000 + i)  # fmt: skip
    producer.flush(30)
    for key, n in (("x", 1), ("y", 1), ("x", 2), ("x", 2), ("x", 3)):
        producer.produce(peer_topics.output_topic, value=result_record(key, str(n), n, 1000, 1))
    producer.flush(30)
    auditor = kafka_io.OutputAuditor(peer_topics, "wordcount", {})
    comparison, actual = auditor()
    assert actual == {"x": 3, "y": 1}
    assert (comparison.lost, comparison.duplicates, comparison.cells) == (0, 1, 2)
    keys_of_run = auditor.run_keys()
    assert keys_of_run["audited"] == "output topic" and keys_of_run["input_events"] == 2
    assert keys_of_run["kafka"]["output_records"] == 5
    assert keys_of_run["kafka"]["repeated"] == 1
    assert keys_of_run["kafka"]["output_topic"] == peer_topics.output_topic
