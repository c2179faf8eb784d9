"""Reading a range of a Kafka partition, or a whole topic, with confluent-kafka: one place for
the two details that make it fast and exact.

- `Consumer.consume(n, timeout)` returns when `n` messages have come or the timeout has passed,
  so asking for more than the range holds waits the whole timeout on every call (a second added
  to each micro-batch). The reads here ask for exactly what remains of the range; the message
  after the range, or the partition's end-of-partition event, completes the last call.
- With `isolation.level=read_committed` offsets have gaps (transaction markers, aborted
  records), so the end of a range is where the consumer's position reaches it, not a count.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

# librdkafka's own messages (a broker away, a coordinator moving) go through Python's logging,
# where the process's handlers and levels apply, instead of straight to stderr.
CLIENT_LOG = logging.getLogger("spark_runtime.kafka_client")

# The largest batch one consume call asks for.
BATCH = 500


def committed_reader(bootstrap: str, group: str) -> Consumer:
    """A consumer of assigned partitions only (no group membership, no commits) that sees
    committed records only, and says where a partition ends."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "logger": CLIENT_LOG,
            "group.id": group,  # required by the client; never joined (assign only)
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            # An offset deleted before it was read: start from the earliest one kept (the
            # Kafka source finds such a loss first, from the partition's low watermark).
            "auto.offset.reset": "earliest",
            "socket.timeout.ms": 10_000,
            "reconnect.backoff.max.ms": 2_000,
        }
    )


def read_range(
    consumer: Consumer,
    topic: str,
    partition: int,
    first: int,
    end: int,
    timeout_s: float | None = None,
    on_wait=None,
) -> Iterator:
    """The committed messages of `topic[partition]` with offsets in [first, end), in order.

    A broker that gives nothing is waited for: for ever when `timeout_s` is None (`on_wait()`
    is called once a second meanwhile), else TimeoutError after `timeout_s` without a message.
    """
    consumer.assign([TopicPartition(topic, partition, first)])
    position = first
    quiet_since = time.monotonic()
    try:
        while position < end:
            messages = consumer.consume(num_messages=min(BATCH, end - position), timeout=1.0)
            if not messages:
                if timeout_s is not None and time.monotonic() - quiet_since > timeout_s:
                    raise TimeoutError(
                        f"{topic}[{partition}] gave nothing at offset {position} "
                        f"for {timeout_s:.0f} s"
                    )
                if on_wait is not None:
                    on_wait()
                continue
            quiet_since = time.monotonic()
            for msg in messages:
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    position = max(position, msg.offset())
                    if position < end:
                        # The end of the partition as it was: the rest of the range is gaps.
                        position = end
                    continue
                offset = msg.offset()
                position = offset + 1
                if offset >= end:
                    position = end
                    break
                yield msg
    finally:
        consumer.unassign()


def read_topic(consumer: Consumer, topic: str, timeout_s: float = 30.0) -> list:
    """Every committed message of every partition of `topic`, up to each partition's end when
    read (partition by partition, offset order in each)."""
    meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
    if meta.error is not None:
        raise KafkaException(meta.error)
    out = []
    for partition in sorted(meta.partitions):
        _low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout_s, cached=False
        )
        out.extend(read_range(consumer, topic, partition, 0, high, timeout_s=timeout_s))
    return out
