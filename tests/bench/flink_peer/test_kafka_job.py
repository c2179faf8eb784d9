"""The Flink peer's PyFlink job on Kafka, for real: a standalone Flink cluster (.venv-flink), the
job of bench/flink_peer/job.py with Flink's KafkaSource and KafkaSink (the connector jar from
Maven Central, bench/flink_peer/connector.py) against the session's Kafka broker.

The test fills an input topic with the benchmark's generator, lets the job count the words,
fails one of its tasks (the benchmark's task-failure fault) and fills more. What a
read_committed reader of the output topic holds is checked against word counts computed here
by hand from the input topic: each word's newest value is its count, and, the sink being
exactly once across the restart, each word has one record per occurrence, versions 1..count,
none read twice.

Slow (about 3 to 5 minutes on 2 cores under load, once .venv-flink exists; installing it the
first time takes several more): `pytest -m slow tests/bench/flink_peer/test_kafka_job.py`.
"""

import json
import re
import time
from collections import Counter

import pytest

from bench.flink_peer import kafka_io
from bench.flink_peer.cluster import FlinkCluster, FlinkSettings
from bench.flink_peer.connector import fetch_kafka_connector
from bench.flink_peer.env import ensure_flink_env
from bench.flink_peer.peer import job_arguments
from spark_runtime import keys
from spark_runtime.generators import generate_to_kafka
from spark_runtime.kafka_read import committed_reader, read_topic

pytestmark = [pytest.mark.slow]


def committed(bootstrap: str, topic: str) -> list:
    consumer = committed_reader(bootstrap, "test-flink-kafka")
    try:
        return read_topic(consumer, topic, timeout_s=30)
    finally:
        consumer.close()


def counted_by_hand(bootstrap: str, topic: str) -> Counter:
    """Each word's occurrences in the input topic's lines: lower-cased, split on whitespace."""
    words = Counter()
    for msg in committed(bootstrap, topic):
        words.update(w for w in re.split(r"\s+", json.loads(msg.value())["text"].lower()) if w)
    return words


def output_records(bootstrap: str, topic: str) -> list[dict]:
    return [json.loads(msg.value()) for msg in committed(bootstrap, topic)]


def newest(records: list[dict]) -> dict[str, int]:
    values: dict[str, tuple[str, int]] = {}
    for record in records:
        key, version = record["key"], record["version"]
        if key not in values or version > values[key][0]:
            values[key] = (version, int(record["value"]))
    return {key: value for key, (_, value) in values.items()}


def wait_for_counts(bootstrap: str, topic: str, expected: Counter, timeout_s: float) -> list:
    deadline = time.time() + timeout_s
    while True:
        records = output_records(bootstrap, topic)
        if newest(records) == dict(expected) or time.time() > deadline:
            return records
        time.sleep(1)


def test_the_job_counts_a_topic_into_a_topic_exactly_once_across_a_task_failure(
    kafka_broker, redis_conn, redis_url, job, tmp_path
):
    bootstrap = kafka_broker.bootstrap_servers
    topics = kafka_io.peer_topics(
        bootstrap, "wordcount", job, f"test-{job}", fetch_kafka_connector()
    )
    assert set(kafka_io.create_topics(topics)) == {topics.input_topic, topics.output_topic}
    generate_to_kafka(bootstrap, topics.input_topic, "wordcount", count=300, rate=10_000, seed=7)
    settings = FlinkSettings(checkpoint_ms=1000, spare_taskmanagers=0)
    started = time.time()
    with FlinkCluster(ensure_flink_env(), settings, tmp_path / "flink") as cluster:
        job_id = cluster.submit(
            job_arguments(
                "wordcount", job, tmp_path / "unused", redis_url, {}, settings, cluster.config,
                topics,
            )
        )  # fmt: skip
        first = counted_by_hand(bootstrap, topics.input_topic)
        records = wait_for_counts(bootstrap, topics.output_topic, first, 90)
        assert newest(records) == dict(first)
        # A task failure (the benchmark's operator-exception), then more input.
        redis_conn.set(keys.flink_task_fault(job), "1")
        generate_to_kafka(
            bootstrap, topics.input_topic, "wordcount", count=300, rate=100, seed=8,
            id_prefix="f",
        )  # fmt: skip
        both = counted_by_hand(bootstrap, topics.input_topic)
        records = wait_for_counts(bootstrap, topics.output_topic, both, 120)
        status = cluster.job_status(job_id)
        cluster.cancel(job_id)
    assert redis_conn.get(keys.flink_task_fault(job)) is None  # a task took the flag
    assert status["state"] == "RUNNING"
    # Flink restarted the job once (the Python exception reaches its history wrapped, as an
    # AsynchronousException of the operator's flush).
    assert len(status["failures"]) == 1, status
    assert sum(both.values()) > sum(first.values()) > 0
    assert newest(records) == dict(both)
    # Exactly once: one record per occurrence of a word, its versions 1..count, none twice.
    assert len(records) == sum(both.values())
    for word, count in both.items():
        versions = sorted(int(r["version"]) for r in records if r["key"] == word)
        assert versions == list(range(1, count + 1)), word
    print(f"Flink on Kafka: {len(records)} records, {time.time() - started:.0f} s")
