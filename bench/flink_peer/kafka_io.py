"""The Flink peer on Kafka (`manage.py bench --source kafka --peer flink`): the run's topics and
job arguments, when its input started, what a reader of its output topic sees, and its audit.

The peer's run gets topics as Backstop's Kafka runs do (bench/strategy/topics.py, `run_topics`:
`bench.{topology}.flink.{stamp}.in` and `.out`), with as many partitions as Backstop creates
(spark_runtime/kafka_admin.py), and the same generator writes the input topic
(`python -m spark_runtime generate`, which finds the topic in the job key's recorded source).
The job (job.py `--source kafka`) reads the input topic with Flink's KafkaSource and writes its
results to the output topic with Flink's KafkaSink, exactly once.

Flink's exactly-once sink commits a checkpoint interval's records in one transaction when the
checkpoint completes, so a reader with `isolation.level=read_committed` sees results only then.
Its output gaps are measured as such a reader sees them: `OutputWatcher` reads the output topic
as it is committed and publishes the progress records the recovery measurement reads (what the
job's result writer publishes when it writes to Redis), with each result's event-time latency
up to the moment it was read.

Runs in the project's environment (confluent-kafka), not in Flink's.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from bench.flink_peer.functions import FLUSH_S, progress_record
from bench.strategy import topics as topics_audit
from spark_runtime.kafka_admin import INPUT_PARTITIONS, SINK_PARTITIONS, create_missing
from spark_runtime.kafka_read import committed_reader, read_range
from spark_runtime.progress import publish_progress

# The replica the watcher's progress records name (the job's output as its readers see it).
WATCHER_REPLICA = "flink/output-topic"


@dataclass(frozen=True)
class PeerTopics:
    """A Flink run's Kafka input and output, and what its job needs to use them."""

    bootstrap: str
    input_topic: str
    output_topic: str
    # The KafkaSink's transactional id prefix (the run's own: two runs never share a
    # transactional id), also the KafkaSource's consumer group.
    transactional_id_prefix: str
    connector_jar: Path

    def job_arguments(self) -> list[str]:
        """job.py's arguments for a Kafka source and sink."""
        return [
            "--source", "kafka", "--bootstrap", self.bootstrap,
            "--input-topic", self.input_topic, "--output-topic", self.output_topic,
            "--transactional-id-prefix", self.transactional_id_prefix,
            "--connector-jar", str(self.connector_jar),
        ]  # fmt: skip


def peer_topics(
    bootstrap: str, topology: str, job_key: str, stamp: str, connector_jar: Path
) -> PeerTopics:
    """The topics of the Flink run `job_key`, named as Backstop's runs' (strategy `flink`)."""
    input_topic, output_topic = topics_audit.run_topics(topology, "flink", stamp)
    return PeerTopics(bootstrap, input_topic, output_topic, f"backstop-peer.{job_key}",
                      Path(connector_jar).resolve())  # fmt: skip


def create_topics(topics: PeerTopics, timeout_s: float = 30.0) -> list[str]:
    """Create the run's input and output topics (one replica: Backstop's broker is one node);
    returns the names created (one that exists is left as it is)."""
    wanted = [
        NewTopic(topics.input_topic, INPUT_PARTITIONS, 1),
        NewTopic(topics.output_topic, SINK_PARTITIONS, 1),
    ]
    return create_missing(topics.bootstrap, wanted, timeout_s)


def first_record_at(bootstrap: str, topic: str, timeout_s: float = 10.0) -> float | None:
    """When the first record of `topic` was written (epoch s: the smallest timestamp among the
    partitions' first records; the generator writes in time order), or None while it is empty."""
    consumer = committed_reader(bootstrap, "backstop-peer-start")
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        stamps = []
        for partition in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s, cached=False
            )
            if high <= low:
                continue
            for msg in read_range(consumer, topic, partition, low, low + 1, timeout_s=timeout_s):
                stamps.append(msg.timestamp()[1] / 1000.0)
        return min(stamps) if stamps else None
    finally:
        consumer.close()


@dataclass
class OutputBatch:
    """What one read of the output topic found: results, the input events they cover, and
    their event-time latencies (s) at `at`."""

    writes: int = 0
    events: int = 0
    latencies: list | None = None


def read_batch(values: list[bytes], at: float) -> OutputBatch:
    """The output records' values (functions.result_record) read at `at` as one batch."""
    batch = OutputBatch(latencies=[])
    for value in values:
        record = json.loads(value)
        batch.writes += 1
        batch.events += int(record.get("events", 0))
        if record.get("ts") is not None:
            batch.latencies.append(at - int(record["ts"]) / 1000.0)
    return batch


class OutputWatcher(threading.Thread):
    """Reads the output topic from its start as a read_committed consumer does, and publishes a
    progress record (stage `flink`) for what it read every `FLUSH_S`: the recovery measurement
    then sees the Flink job's output when its readers do. Stops when `stop()` is called."""

    def __init__(self, client, job_key: str, bootstrap: str, topic: str):
        super().__init__(name="flink-output-watcher", daemon=True)
        self.client = client
        self.job_key = job_key
        self.bootstrap = bootstrap
        self.topic = topic
        self.records = 0
        self.published = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop_event.set()
        self.join(timeout_s)

    def run(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # reported with the run: the peer's figures need it
            self.error = exc

    def _watch(self) -> None:
        consumer = committed_reader(self.bootstrap, f"backstop-peer-watch-{self.job_key}")
        try:
            meta = consumer.list_topics(self.topic, timeout=30).topics[self.topic]
            consumer.assign(
                [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in meta.partitions]
            )
            pending: list[bytes] = []
            flushed_at = time.time()
            while True:
                stopping = self._stop_event.is_set()
                for msg in consumer.consume(num_messages=500, timeout=0.05):
                    if msg.error() is None:
                        pending.append(msg.value())
                    elif msg.error().code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(msg.error())
                now = time.time()
                if pending and (now - flushed_at >= FLUSH_S or stopping):
                    self._publish(read_batch(pending, now), now)
                    pending, flushed_at = [], now
                if stopping:
                    return
        finally:
            consumer.close()

    def _publish(self, batch: OutputBatch, at: float) -> None:
        record = progress_record(
            WATCHER_REPLICA, "output-topic", self.published, at, batch.events, batch.writes,
            batch.latencies,
        )  # fmt: skip
        publish_progress(self.client, self.job_key, record)
        self.records += batch.writes
        self.published += 1


class OutputAuditor:
    """The output topic's audit (bench/strategy/topics.py) as `drain` calls it: (comparison,
    results) now; the latest audit is kept for the run's figures."""

    def __init__(self, topics: PeerTopics, topology: str, params: dict):
        self.topics, self.topology, self.params = topics, topology, params
        self.last: topics_audit.TopicAudit | None = None

    def __call__(self) -> tuple:
        self.last = topics_audit.audit_topics(
            self.topics.bootstrap, self.topology, self.params, self.topics.input_topic,
            self.topics.output_topic,
        )  # fmt: skip
        return self.last.comparison, self.last.actual

    def run_keys(self) -> dict:
        """The run's keys of bench.json about its Kafka input and output (as Backstop's runs on
        Kafka have them: bench/strategy/run.py, `source_keys`)."""
        audit = self.last
        return {
            "audited": "output topic",
            "input_events": audit.input_records,
            "kafka": {
                "bootstrap_servers": self.topics.bootstrap,
                "input_topic": self.topics.input_topic,
                "output_topic": self.topics.output_topic,
                "output_records": audit.output_records,
                "repeated": audit.repeated,
            },
        }
