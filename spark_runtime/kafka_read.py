"""Reading a range of a Kafka partition, or a whole topic, with confluent-kafka: one place for
the details that make it fast and exact.

- `Consumer.consume(n, timeout)` returns when `n` messages have come or the timeout has passed,
  even after the partition's end-of-partition event, so asking for more than will come waits
  the whole timeout. The reads here take what has already arrived without waiting, and when
  nothing has, wait for one message or event only: a read returns as soon as its range is done.
- With `isolation.level=read_committed` offsets have gaps (transaction markers, aborted
  records), so the end of a range is where the consumer's position reaches it, not a count:
  the offsets left are more than the messages that will come. A transactional topic's range
  ends on a commit marker, so asking for "what remains" waited out the timeout at every such
  end (a second for each read of the Kafka sink's marks topic, at every promotion).

A broker that is away (stopped, restarting) shows as errors such as "transport failure" or
"all brokers down" delivered through `consume`, or as calls that time out: `broker_away` tells
them from real errors, and the reads wait them out instead of failing.
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
# librdkafka's wait between two connection attempts doubles up to this (its default, 10 s,
# kept a returned broker unused for up to 10 s): a broker that comes back is used within ~1 s.
RECONNECT_BACKOFF_MAX_MS = 1000
# How long the broker holds a fetch that finds nothing new. A reader learns that it reached a
# partition's end (the end-of-partition event) only from a fetch that found nothing, so Kafka's
# default of 500 ms was added to every read whose range ends on a transaction marker, e.g. each
# read of the Kafka sink's marks topic at a promotion. The readers here read ranges the broker
# holds, so a short wait costs only fetches repeated while a partition has nothing new.
END_FETCH_WAIT_MS = 10

# A reader waiting for a broker that is away asks again after this long at most.
WAIT_RETRY_MAX_S = 1.0

# Errors of a broker that is away or just back (its partitions' leaders not known yet), which
# a client outlives: a read or a write waits them out.
BROKER_AWAY_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._WAIT_COORD,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        # A request in flight on the handle of a broker that went away and came back: the
        # client drops that handle and the next request goes to the new one (seen in a
        # partition's watermark lookup during a 20 s broker outage, which failed the query).
        KafkaError._DESTROY_BROKER,
    }
)


def broker_away(error: KafkaError) -> bool:
    """Whether `error` says the broker cannot be reached now (retry later), not that the request
    is wrong."""
    return error.code() in BROKER_AWAY_CODES or bool(error.retriable())


def committed_reader(bootstrap: str, group: str, settings: dict | None = None) -> Consumer:
    """A consumer of assigned partitions only (no group membership, no commits) that sees
    committed records only, and says where a partition ends. `settings` are the caller's own
    client settings (security, isolation level), applied on top."""
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
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
            "fetch.wait.max.ms": END_FETCH_WAIT_MS,
            **(settings or {}),
        }
    )


def low_watermark(consumer: Consumer, topic: str, partition: int, timeout_s: float,
                  on_wait=None) -> int:  # fmt: skip
    """The earliest offset `topic[partition]` keeps, asked of the broker until it answers: a
    broker that is away (`broker_away`) is asked again, doubling the wait from 0.25 s up to
    WAIT_RETRY_MAX_S, and each such error goes to `on_wait(timeout_s, error)`."""
    delay = 0.25
    while True:
        try:
            low, _high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s, cached=False
            )
            return low
        except KafkaException as exc:
            if not broker_away(exc.args[0]):
                raise
            if on_wait is not None:
                on_wait(timeout_s, exc.args[0])
            time.sleep(delay)
            delay = min(delay * 2, WAIT_RETRY_MAX_S)


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

    A broker that gives nothing, or is away (`broker_away` errors), is waited for: for ever
    when `timeout_s` is None, else TimeoutError after `timeout_s` without a message. Meanwhile
    `on_wait(quiet_s, error)` is called about once a second: the seconds without a message and
    the last broker error seen (None: the broker only said nothing).
    """
    consumer.assign([TopicPartition(topic, partition, first)])
    position = first
    quiet_since = time.monotonic()
    away: KafkaError | None = None  # the last "broker away" error since the broker last answered
    try:
        while position < end:
            messages = consumer.consume(num_messages=min(BATCH, end - position), timeout=0)
            if not messages:
                # Nothing has arrived: wait for the next message or event, at most a second.
                messages = consumer.consume(num_messages=1, timeout=1.0)
            heard = False  # a record or the partition's end: the broker answers
            for msg in messages:
                error = msg.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    if not broker_away(error):
                        raise KafkaException(error)
                    away = error
                    continue
                heard = True
                if error is not None:
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
            if heard:
                quiet_since, away = time.monotonic(), None
                continue
            quiet_s = time.monotonic() - quiet_since
            if timeout_s is not None and quiet_s > timeout_s:
                raise TimeoutError(
                    f"{topic}[{partition}] gave nothing at offset {position} for "
                    f"{timeout_s:.0f} s" + (f" ({away.str()})" if away is not None else "")
                )
            if on_wait is not None:
                on_wait(quiet_s, away)
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
