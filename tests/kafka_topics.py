"""Reading a Kafka topic in the tests, in plain Python (never through spark_runtime's readers,
whose behaviour the tests check): every committed record, partition by partition."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, TopicPartition


def committed(bootstrap: str, topic: str) -> list[tuple[int, int, bytes | None, bytes]]:
    """(partition, offset, key, value) of every committed record of `topic`, read with a
    read_committed consumer up to each partition's end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-reader",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        done, out = set(), []
        while len(done) < len(partitions):
            msg = consumer.poll(10.0)  # one message or event, as soon as there is one
            assert msg is not None, f"{topic} gave nothing for 10 s"
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF
                done.add(msg.partition())
            else:
                out.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
        return out
    finally:
        consumer.close()
