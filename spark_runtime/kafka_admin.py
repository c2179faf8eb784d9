"""Creating the Kafka topics a job writes: its input (when Backstop's generator feeds it), the
input's dead-letter topic, and its sink with the sink's marks (spark_runtime/kafka_sink.py).

Idempotent: a topic that exists is left as it is, so a launch run again changes nothing.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from spark_runtime.external_io import ExternalIO
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
    bootstrap = (io.source or io.sink).bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = []
    futures = admin.create_topics(wanted, request_timeout=timeout_s)
    for name, future in futures.items():
        try:
            future.result(timeout_s)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created
