"""Reading and writing a Kafka topic in the tests, in plain Python (never through
spark_runtime's readers and writers, whose behaviour the tests check): every committed record,
partition by partition; the (key, count) updates of a word count; lines of input."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition


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


def counts_written(bootstrap: str, topic: str) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """The newest count of each key of a word count's output topic (key the word, value the
    count as text), and every (word, count) written, in order."""
    written = [(k.decode(), int(v)) for _p, _o, k, v in committed(bootstrap, topic)]
    return dict(written), written


def produce_lines(
    bootstrap: str, topic: str, lines: list[str], partitions: int = 3, every_s: float = 0.0
) -> None:
    """Write each line as a record's value, round robin over `partitions`, `every_s` apart,
    and wait until the broker has taken all of them."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for i, line in enumerate(lines):
        producer.produce(topic, value=line.encode(), partition=i % partitions)
        producer.poll(0)
        time.sleep(every_s)
    assert producer.flush(60) == 0
