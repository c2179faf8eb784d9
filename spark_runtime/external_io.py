"""Where a job reads and writes outside Backstop's own Redis streams: a Kafka source and sink.

A job launched with `{"source": {"kind": "kafka", "topic": ...}}` (and/or a `sink` of the same
shape) keeps that choice in one Redis key (`keys.external_io`), written at launch before any
replica starts; every stage process, standby and spare reads it there, so a replica started on
any node finds the same topic, starting point and sink. Without the key the job reads its input
stream and writes its results hash, as before.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from spark_runtime import keys

KAFKA = "kafka"
STARTING_OFFSETS = ("earliest", "latest")
EVENT_TIME_FROM_RECORD = "timestamp"  # the record's Kafka timestamp
TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class InvalidExternalIO(ValueError):
    """A source or sink definition that cannot be used; the message names the field."""


@dataclass(frozen=True)
class KafkaSource:
    """A Kafka topic as a job's input. Values are JSON objects carrying the job's declared
    fields; `event_time` is `timestamp` (the record's Kafka timestamp) or a declared integer field
    (epoch ms). `accept_loss`: offsets deleted by retention before they were read are skipped
    and counted instead of failing the job."""

    topic: str
    bootstrap: str
    starting_offsets: str = "earliest"
    event_time: str = EVENT_TIME_FROM_RECORD
    max_records_per_trigger: int | None = None
    accept_loss: bool = False

    @property
    def dead_letter_topic(self) -> str:
        """Where records that do not decode go, with the reason."""
        return f"{self.topic}.dead"


@dataclass(frozen=True)
class KafkaSink:
    """A Kafka topic the job's results are written to, once each, by transactions."""

    topic: str
    bootstrap: str


@dataclass(frozen=True)
class ExternalIO:
    """A job's Kafka source and sink (either may be None)."""

    source: KafkaSource | None = None
    sink: KafkaSink | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "source": asdict(self.source) if self.source else None,
                "sink": asdict(self.sink) if self.sink else None,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> ExternalIO:
        if not raw:
            return cls()
        data = json.loads(raw)
        source = KafkaSource(**data["source"]) if data.get("source") else None
        sink = KafkaSink(**data["sink"]) if data.get("sink") else None
        return cls(source, sink)


def _topic(value, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidExternalIO(f"{field}: a topic name is required")
    if len(value) > 249 or not set(value) <= TOPIC_CHARS or value in (".", ".."):
        raise InvalidExternalIO(
            f"{field}: {value[:60]!r} is not a Kafka topic name (letters, digits, '.', '_', '-')"
        )
    return value


def _kind(data, field: str) -> None:
    if not isinstance(data, dict):
        raise InvalidExternalIO(f"{field}: expected an object such as {{'kind': 'kafka', ...}}")
    if data.get("kind") != KAFKA:
        kind = data.get("kind")
        raise InvalidExternalIO(f"{field}.kind: only 'kafka' is supported, got {kind!r}")


def parse_source(data, bootstrap: str, field_names: tuple[str, ...] = ()) -> KafkaSource:
    """A KafkaSource from an API or job-definition dict; raises InvalidExternalIO naming the
    field. `field_names`: the job's declared input fields (an event-time field must be one)."""
    _kind(data, "source")
    unknown = set(data) - {
        "kind", "topic", "starting_offsets", "event_time", "max_records_per_trigger",
        "accept_loss",
    }  # fmt: skip
    if unknown:
        raise InvalidExternalIO(f"source.{sorted(unknown)[0]}: unknown field")
    topic = _topic(data.get("topic"), "source.topic")
    starting = data.get("starting_offsets", "earliest")
    if starting not in STARTING_OFFSETS:
        raise InvalidExternalIO(
            f"source.starting_offsets: expected one of {', '.join(STARTING_OFFSETS)}, "
            f"got {starting!r}"
        )
    event_time = data.get("event_time", EVENT_TIME_FROM_RECORD)
    if event_time != EVENT_TIME_FROM_RECORD and event_time not in field_names:
        raise InvalidExternalIO(
            f"source.event_time: {event_time!r} is neither 'timestamp' nor a declared field"
        )
    bound = data.get("max_records_per_trigger")
    if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 1):
        raise InvalidExternalIO("source.max_records_per_trigger: expected a positive integer")
    accept_loss = data.get("accept_loss", False)
    if not isinstance(accept_loss, bool):
        raise InvalidExternalIO("source.accept_loss: expected true or false")
    return KafkaSource(topic, bootstrap, starting, event_time, bound, accept_loss)


def parse_sink(data, bootstrap: str) -> KafkaSink:
    """A KafkaSink from an API dict; raises InvalidExternalIO naming the field."""
    _kind(data, "sink")
    unknown = set(data) - {"kind", "topic"}
    if unknown:
        raise InvalidExternalIO(f"sink.{sorted(unknown)[0]}: unknown field")
    return KafkaSink(_topic(data.get("topic"), "sink.topic"), bootstrap)


def save(client, job: str, io: ExternalIO) -> None:
    """Record the job's source and sink (before its replicas start); nothing for plain jobs."""
    if io.source is None and io.sink is None:
        client.delete(keys.external_io(job))
    else:
        client.set(keys.external_io(job), io.to_json())


def load(client, job: str) -> ExternalIO:
    """The job's source and sink as recorded at launch (both None for a plain job)."""
    return ExternalIO.from_json(client.get(keys.external_io(job)))
