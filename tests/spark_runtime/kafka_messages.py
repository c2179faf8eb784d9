"""A stand-in for confluent-kafka's Message, for tests of the readers without a broker."""

from __future__ import annotations

from confluent_kafka import KafkaError


class Message:
    """A message at `offset` (or an event, with `error`) whose value is one line of text."""

    def __init__(self, offset: int, error: KafkaError | None = None):
        self._offset, self._error = offset, error

    def offset(self) -> int:
        return self._offset

    def error(self) -> KafkaError | None:
        return self._error

    def value(self) -> bytes:
        return b'{"text": "a b"}'
