"""A stage's final outputs into a Kafka topic, exactly once across restarts and failovers.

Every replica of a stage produces with the same `transactional.id` (`backstop.{job}.{stage}`).
A replica that becomes the stage's writer (a primary at start, a standby at promotion) calls
`init_transactions()`, which makes the broker fence every older producer with that id: the old
primary's open transaction is aborted and its next send or commit fails (Kafka's own zombie
fencing, beside Backstop's Redis epoch, which is checked before each transaction too).

A hot standby does everything else while it stands by (`prepare`): it makes its producer and
fetches the sink's topics' metadata, which opens its broker connection. A producer fences
nobody until `init_transactions()`, so the primary writes on meanwhile, and a promotion is left
with the fencing and the reading of the marks. Measured on the tests' broker:
`init_transactions()` took 64-69 ms on a new producer, 5-11 ms on a prepared one
(docs/KAFKA.md, "Exactly once into Kafka"), within minutes of the preparation. A broker closes
a connection idle for its `connections.max.idle.ms` (10 min by default); a promotion after
that reconnects first, which was not measured.

Each batch's records go out in one transaction together with a *mark*: the highest output
version written, per sink, in the topic's companion `{topic}.marks` (compacted, one partition).
A writer reads the committed marks when it takes over and skips every record at or below them,
so a batch run again after a crash or a promotion writes nothing twice. Versions are the ones the
Redis sinks use (spark_runtime/sink.py: the input position and the record's ordinal); the stage
writes Kafka before Redis, so the Redis watermark a standby trims its buffer by never passes
what Kafka has.

Each record's key is the result key (a word, a window) or the record's id; its value is JSON
`{"key", "value" | fields..., "version"}`. A reader with `isolation.level=read_committed` sees
each result once.
"""

from __future__ import annotations

import json
import logging
import time

from confluent_kafka import KafkaError, KafkaException, Producer

from spark_runtime import keys
from spark_runtime.external_io import KafkaSink
from spark_runtime.kafka_read import (
    CLIENT_LOG,
    RECONNECT_BACKOFF_MAX_MS,
    committed_reader,
    read_topic,
)
from spark_runtime.sink import FencedError, HashRow

log = logging.getLogger(__name__)

MARKS_SUFFIX = ".marks"
COMMIT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 30.0
# A standby's preparation waits this long at most for a broker that does not answer (the
# promotion then connects instead).
PREPARE_TIMEOUT_S = 5.0


def marks_topic(topic: str) -> str:
    """The companion topic holding each stage's committed output versions."""
    return topic + MARKS_SUFFIX


def transactional_id(job: str, stage: str) -> str:
    """The transactional id every replica of `stage` shares."""
    return f"backstop.{job}.{stage}"


def committed_marks(bootstrap: str, topic: str, job: str, stage: str) -> dict[str, str]:
    """The stage's committed versions per sink, from the marks topic."""
    prefix = f"{job}|{stage}|".encode()
    marks: dict[str, str] = {}
    consumer = committed_reader(bootstrap, "backstop-marks")
    try:
        for msg in read_topic(consumer, marks_topic(topic), READ_TIMEOUT_S):
            key = msg.key()
            if key is not None and key.startswith(prefix):
                marks[key[len(prefix) :].decode()] = json.loads(msg.value())["version"]
    finally:
        consumer.close()
    return marks


def retrying(call, what: str) -> None:
    """Run a transactional call of `what`'s producer, waiting out a broker that does not answer
    (retriable errors); a fenced producer raises FencedError."""
    delay = 0.5
    while True:
        try:
            call()
            return
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED) or (
                error.fatal() and "fenc" in error.str().lower()
            ):
                raise FencedError(f"kafka producer of {what} fenced: {error.str()}") from None
            if not error.retriable():
                raise
            log.warning("kafka producer of %s: %s; retrying", what, error.str())
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def record_of(sink: str, record) -> tuple[str, dict]:
    """The Kafka key and JSON value of one sink record (a results row or an emitted record)."""
    if isinstance(record, HashRow):
        return record.field, {"key": record.field, "value": record.value, "version": record.version}
    key = str(record.fields.get("id") or record.version)
    return key, {**record.fields, "version": record.version}


class KafkaResultWriter:
    """Writes a stage's final records to its job's Kafka sink in one transaction per batch."""

    def __init__(self, client, sink: KafkaSink, job: str, stage: str):
        self.client = client  # Redis: the stage's fencing epoch
        self.sink = sink
        self.job = job
        self.stage = stage
        self.producer: Producer | None = None
        self.marks: dict[str, str] = {}
        self.epoch: int | None = None

    def _make_producer(self) -> Producer:
        """The stage's transactional producer, made once; it fences nobody until
        `init_transactions()`."""
        if self.producer is None:
            self.producer = Producer(
                {
                    "bootstrap.servers": self.sink.bootstrap,
                    "logger": CLIENT_LOG,
                    "transactional.id": transactional_id(self.job, self.stage),
                    "enable.idempotence": True,
                    "transaction.timeout.ms": 60_000,
                    "linger.ms": 5,
                    # A broker back from an outage is used within a second, not up to 10 s.
                    "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
                }
            )
        return self.producer

    def prepare(self) -> None:
        """Get ready to become the writer without fencing anyone (a hot standby): make the
        producer and fetch the metadata of the sink's topics, so that `acquire` only fences and
        reads the marks. A broker that does not answer is not waited for past
        PREPARE_TIMEOUT_S: `acquire` connects then."""
        producer = self._make_producer()
        deadline = time.monotonic() + PREPARE_TIMEOUT_S
        for topic in (self.sink.topic, marks_topic(self.sink.topic)):
            try:
                producer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
            except KafkaException as exc:
                log.warning("kafka sink %s: not prepared (%s); the promotion will connect",
                            self.sink.topic, exc.args[0].str())  # fmt: skip
                return

    def acquire(self, epoch: int) -> None:
        """Become the stage's Kafka writer under Redis epoch `epoch`: fence every older producer
        of the stage at the broker, then learn what it had committed."""
        producer = self._make_producer()
        retrying(lambda: producer.init_transactions(COMMIT_TIMEOUT_S), self.stage)
        self.marks = committed_marks(self.sink.bootstrap, self.sink.topic, self.job, self.stage)
        self.epoch = epoch
        log.info("kafka sink %s: writer of %s at epoch %s, marks %s",
                 self.sink.topic, self.stage, epoch, self.marks)  # fmt: skip

    def _check_epoch(self) -> None:
        current = self.client.get(keys.fence(self.job, self.stage)) or "0"
        if str(current) != str(self.epoch):
            raise FencedError(f"stage epoch is {current}, kafka writer has {self.epoch}")

    def write(self, sink: str, records: list) -> int:
        """Produce the records above the sink's mark, and the new mark, in one transaction;
        returns how many records were produced."""
        mark = self.marks.get(sink, "")
        fresh = sorted((r for r in records if r.version > mark), key=lambda r: r.version)
        if not fresh:
            return 0
        self._check_epoch()
        new_mark = fresh[-1].version
        while True:
            self.producer.begin_transaction()
            try:
                for record in fresh:
                    key, value = record_of(sink, record)
                    self.producer.produce(self.sink.topic, key=key, value=json.dumps(value))
                    self.producer.poll(0)
                self.producer.produce(
                    marks_topic(self.sink.topic),
                    key=f"{self.job}|{self.stage}|{sink}",
                    value=json.dumps({"version": new_mark}),
                )
                retrying(lambda: self.producer.commit_transaction(COMMIT_TIMEOUT_S), self.stage)
                break
            except KafkaException as exc:
                if not exc.args[0].txn_requires_abort():
                    raise
                log.warning("kafka sink %s: transaction aborted (%s); writing it again",
                            self.sink.topic, exc.args[0].str())  # fmt: skip
                retrying(lambda: self.producer.abort_transaction(COMMIT_TIMEOUT_S), self.stage)
        self.marks[sink] = new_mark
        return len(fresh)
