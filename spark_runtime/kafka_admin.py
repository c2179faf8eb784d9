"""Creating the Kafka topics a job writes: its input (when Backstop's generator feeds it), the
input's dead-letter topic, and its sink with the sink's marks (spark_runtime/kafka_sink.py);
idempotent: a topic that exists is left as it is, so a launch run again changes nothing. And
where a warm-up starts reading a job's newest records (`recent_start`).
"""

from __future__ import annotations

import time

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from spark_runtime.external_io import ExternalIO, KafkaSource
from spark_runtime.kafka_read import CLIENT_LOG, broker_away, committed_reader
from spark_runtime.kafka_sink import marks_topic

# Partitions of the topics Backstop creates itself: enough that the shared read plan spans
# several partitions (as a team's topics do), few enough for a 2-core machine.
INPUT_PARTITIONS = 3
SINK_PARTITIONS = 2


def wanted_topics(io: ExternalIO, with_input: bool) -> list[NewTopic]:
    """The topics `io` needs; the input only `with_input` (Backstop's generator writes it)."""
    topics = []
    if io.source is not None:
        if with_input:
            topics.append(NewTopic(io.source.topic, INPUT_PARTITIONS, 1))
        topics.append(NewTopic(io.source.dead_letter_topic, 1, 1))
    if io.sink is not None:
        topics.append(NewTopic(io.sink.topic, SINK_PARTITIONS, 1))
        # One partition, compacted: a writer reads every stage's newest mark from it.
        topics.append(
            NewTopic(marks_topic(io.sink.topic), 1, 1, config={"cleanup.policy": "compact"})
        )
    return topics


def ensure_topics(io: ExternalIO, with_input: bool, timeout_s: float = 30.0) -> list[str]:
    """Create the topics of `io` that do not exist yet; returns the names created. Raises
    KafkaException when the cluster does not answer within `timeout_s`."""
    wanted = wanted_topics(io, with_input)
    if not wanted:
        return []
    return create_missing((io.source or io.sink).bootstrap, wanted, timeout_s)


def create_missing(bootstrap: str, wanted: list[NewTopic], timeout_s: float = 30.0) -> list[str]:
    """Create the topics of `wanted` that do not exist yet on `bootstrap`; returns the names
    created (one that exists is left as it is) once every partition of `wanted` is served by
    its leader. Raises KafkaException on any other error."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": CLIENT_LOG})
    created = []
    futures = admin.create_topics(wanted, request_timeout=timeout_s)
    for name, future in futures.items():
        try:
            future.result(timeout_s)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    wait_until_served(bootstrap, {topic.topic: topic.num_partitions for topic in wanted}, timeout_s)
    return created


def wait_until_served(bootstrap: str, partitions: dict[str, int], timeout_s: float = 30.0) -> None:
    """Return once the leader of every partition of `partitions` (topic -> count) answers a
    watermark lookup. The broker acknowledges a topic's creation before its partitions' leaders
    serve them: a reader asking at once was told NOT_LEADER_FOR_PARTITION. Raises the last
    error when they do not serve within `timeout_s`, or at once on one that is not transient."""
    deadline = time.monotonic() + timeout_s
    consumer = committed_reader(bootstrap, "backstop-topic-check")
    try:
        for topic, count in partitions.items():
            for partition in range(count):
                _serving_watermarks(consumer, TopicPartition(topic, partition), deadline)
    finally:
        consumer.close()


def _serving_watermarks(consumer, partition: TopicPartition, deadline: float) -> tuple[int, int]:
    """The partition's watermarks, asked until its leader answers or `deadline` passes."""
    while True:
        remaining = max(deadline - time.monotonic(), 0.1)
        try:
            return consumer.get_watermark_offsets(partition, timeout=remaining, cached=False)
        except KafkaException as exc:
            error = exc.args[0]
            if not (broker_away(error) or error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
                raise
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.1)


def recent_start(source: KafkaSource, records: int, timeout_s: float = 10.0):
    """A start vector about `records` committed offsets before the topic's end, shared among
    its partitions (not before a partition's start), or None when the topic holds nothing yet:
    where a warm spare's warm-up reads a few of the job's newest records
    (spark_runtime/spare_plans.py)."""
    admin = AdminClient({"bootstrap.servers": source.bootstrap})
    meta = admin.list_topics(source.topic, timeout=timeout_s).topics[source.topic]
    if meta.error is not None:
        raise KafkaException(meta.error)
    found = {}
    for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
        request = {TopicPartition(source.topic, p): spec for p in meta.partitions}
        futures = admin.list_offsets(
            request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout_s
        )
        found[spec] = {tp.partition: f.result(timeout_s).offset for tp, f in futures.items()}
    low, high = found.values()
    if all(high[p] <= low[p] for p in high):
        return None
    per_partition = max(1, records // len(high))
    return {p: max(low[p], high[p] - per_partition) for p in high}
