"""A broker that is away, as the data plane's Kafka reads see it, with a stand-in consumer (no
broker, no Spark): a range being read waits out "transport failure" and "all brokers down"
instead of failing, other errors still fail it, and the Python worker's cause in the job's stats
hash is written while it waits and deleted when the broker answers again. The same on a real
broker stopped under a running job: tests/integration/test_kafka_broker_fault_live.py."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from spark_runtime import keys
from spark_runtime.kafka_plan import Segment
from spark_runtime.kafka_read import broker_away, read_range
from spark_runtime.kafka_source import SOURCE_CAUSE, KafkaPlanReader, WorkerWait
from tests.spark_runtime.kafka_messages import Message


class Consumer:
    """Gives the batches it was handed, one per consume call that waits (one that does not
    finds nothing arrived yet), then nothing."""

    def __init__(self, batches, watermark_errors: int = 0):
        self.batches = list(batches)
        self.watermark_errors = watermark_errors

    def assign(self, partitions) -> None:
        pass

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int, timeout: float):
        if timeout == 0:
            return []
        return self.batches.pop(0) if self.batches else []

    def get_watermark_offsets(self, partition, timeout, cached):
        if self.watermark_errors:
            self.watermark_errors -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
        return 0, 100


AWAY = KafkaError(KafkaError._ALL_BROKERS_DOWN, "All broker connections are down")


def test_broker_away_errors_are_told_from_real_ones():
    assert broker_away(AWAY)
    assert broker_away(KafkaError(KafkaError._TRANSPORT))
    assert broker_away(KafkaError(KafkaError._UNKNOWN_PARTITION))
    assert broker_away(KafkaError(KafkaError._DESTROY_BROKER))  # its handle replaced on return
    assert not broker_away(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))


def test_a_range_read_waits_out_a_broker_away_and_goes_on():
    consumer = Consumer([[Message(0), Message(1)], [Message(-1, AWAY)], [], [Message(2)]])
    waits = []
    got = list(read_range(consumer, "t", 0, 0, 3, on_wait=lambda q, e: waits.append(e)))
    assert [m.offset() for m in got] == [0, 1, 2]
    assert [e.code() if e else None for e in waits] == [KafkaError._ALL_BROKERS_DOWN] * 2


def test_other_errors_still_fail_the_read():
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied")
    with pytest.raises(KafkaException):
        list(read_range(Consumer([[Message(-1, denied)]]), "t", 0, 0, 3))


def test_a_read_with_a_timeout_gives_up_after_it_naming_the_broker_error():
    consumer = Consumer([[Message(-1, AWAY)]] * 3)
    with pytest.raises(TimeoutError, match="gave nothing at offset 0 for 0 s .*All broker"):
        list(read_range(consumer, "t", 0, 0, 3, timeout_s=0.0))


def test_the_worker_writes_the_cause_while_waiting_then_deletes_it(redis_conn, job, redis_url):
    reader = KafkaPlanReader(
        {"bootstrapServers": "broker:9092", "topic": "lines", "redisUrl": redis_url, "job": job},
        [("text", "string")],
    )
    consumer = Consumer([[Message(-1, AWAY)], [Message(0)], [Message(1)]], watermark_errors=2)
    waiting = WorkerWait(reader)
    part = Segment(1, 1_700_000_000_000, 0, 0, 2, 0)
    assert reader._check_lost(consumer, part, waiting) == 0
    assert not redis_conn.hexists(keys.stats(job), SOURCE_CAUSE)  # answered: deleted again
    seen = []
    for msg in read_range(consumer, "lines", 0, 0, 2, on_wait=waiting.waiting):
        seen.append((msg.offset(), redis_conn.hget(keys.stats(job), SOURCE_CAUSE)))
        waiting.answered()
    assert seen[0] == (0, "broker broker:9092 does not answer: All broker connections are down")
    assert seen[1] == (1, None)
