"""Reading a range of a read_committed partition whose offsets have gaps (spark_runtime/
kafka_read.py), with a stand-in consumer that behaves as confluent-kafka's does: a consume call
returns when it has the messages it asked for, or only when its timeout has passed. A range of
a transactional topic ends on a commit marker, an offset no message comes for; its end shows as
the partition's end-of-partition event."""

from __future__ import annotations

from confluent_kafka import KafkaError

from spark_runtime.kafka_read import read_range
from tests.spark_runtime.kafka_messages import Message


class ArrivedConsumer:
    """Holds the messages that have arrived; notes each call that would wait out its timeout
    (it asks for more than has arrived, and nothing more will come)."""

    def __init__(self, arrived: list[Message]):
        self.arrived = list(arrived)
        self.waited_out: list[tuple[int, float]] = []

    def assign(self, partitions) -> None:
        pass

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int, timeout: float):
        if timeout > 0 and num_messages > len(self.arrived):
            self.waited_out.append((num_messages, timeout))
        taken, self.arrived = self.arrived[:num_messages], self.arrived[num_messages:]
        return taken


def test_a_range_ending_on_transaction_markers_ends_at_the_partition_end_without_waiting():
    # Records at 0, 2 and 4, each followed by its transaction's commit marker; the end is 6.
    end_of_partition = Message(6, KafkaError(KafkaError._PARTITION_EOF))
    consumer = ArrivedConsumer([Message(0), Message(2), Message(4), end_of_partition])
    got = [m.offset() for m in read_range(consumer, "t.marks", 0, 0, 6)]
    assert got == [0, 2, 4]
    assert consumer.waited_out == []


def test_a_range_waits_for_messages_that_have_not_arrived_yet():
    consumer = ArrivedConsumer([])
    consumer.consume = lambda num_messages, timeout: (
        [Message(0)] if timeout > 0 else []  # nothing queued, then the record comes
    )
    assert [m.offset() for m in read_range(consumer, "t", 0, 0, 1)] == [0]
