"""The Kafka sink's writer on a real broker (no Spark): a hot standby's writer is ready before it
takes over (its producer made and connected) without fencing the primary, and taking over only
fences the primary at the broker and reads the committed marks."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from spark_runtime import kafka_sink
from spark_runtime.external_io import KafkaSink
from spark_runtime.kafka_sink import KafkaResultWriter, marks_topic
from spark_runtime.sink import FencedWriter, HashRow, version


@pytest.fixture
def sink(kafka_broker) -> KafkaSink:
    bootstrap = kafka_broker.bootstrap_servers
    topic = f"t{uuid.uuid4().hex[:8]}.out"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [
        NewTopic(topic, 2, 1),
        NewTopic(marks_topic(topic), 1, 1, config={"cleanup.policy": "compact"}),
    ]
    for future in admin.create_topics(wanted).values():
        future.result(30)
    return KafkaSink(topic, bootstrap)


def test_a_standby_prepares_its_producer_without_fencing_the_primary(
    redis_conn, job, sink, monkeypatch
):
    primary = KafkaResultWriter(redis_conn, sink, job, "count")
    primary.acquire(FencedWriter(redis_conn, job, "count").acquire())
    assert primary.write("results", [HashRow(version(1), "a", "1")]) == 1

    standby = KafkaResultWriter(redis_conn, sink, job, "count")
    standby.prepare()
    prepared = standby.producer
    assert prepared is not None
    # The prepared producer shares the primary's transactional id, and fences it only once it
    # initialises its transactions: the primary still commits.
    assert primary.write("results", [HashRow(version(2), "a", "2")]) == 1

    def no_new_producer(conf):
        raise AssertionError("a prepared writer makes no producer when it takes over")

    monkeypatch.setattr(kafka_sink, "Producer", no_new_producer)
    standby.acquire(FencedWriter(redis_conn, job, "count").acquire())
    assert standby.producer is prepared
    assert standby.marks == {"results": version(2)}
    # Taking over fenced the primary at the broker.
    old = primary.producer
    with pytest.raises(KafkaException) as refused:
        old.begin_transaction()
        old.produce(sink.topic, key="zombie", value=b"{}")
        old.commit_transaction(10)
    assert "fenced" in refused.value.args[0].str().lower()
    assert standby.write("results", [HashRow(version(3), "a", "3")]) == 1
