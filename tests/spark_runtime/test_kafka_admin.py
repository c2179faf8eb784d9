"""Creating topics on the session's real broker: created once, and served when created."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from spark_runtime.kafka_admin import create_missing, wait_until_served
from spark_runtime.kafka_read import committed_reader


def test_created_topics_are_served_by_their_leaders_at_once(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    names = [f"admin-{uuid.uuid4().hex[:8]}-{n}" for n in range(4)]
    wanted = [NewTopic(name, 3, 1) for name in names]
    assert sorted(create_missing(bootstrap, wanted)) == sorted(names)
    assert create_missing(bootstrap, wanted) == []
    # One lookup each, no retry: a partition whose leader did not serve yet answered
    # NOT_LEADER_FOR_PARTITION here (a CI run failed so).
    consumer = committed_reader(bootstrap, "test-admin")
    try:
        for name in names:
            for partition in range(3):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(name, partition), timeout=10, cached=False
                )
                assert (low, high) == (0, 0)
    finally:
        consumer.close()


def test_a_topic_that_never_appears_is_an_error_after_the_timeout(kafka_broker):
    started = time.monotonic()
    with pytest.raises(KafkaException):
        wait_until_served(kafka_broker.bootstrap_servers, {f"never-{uuid.uuid4().hex}": 1}, 1.5)
    assert time.monotonic() - started < 10
