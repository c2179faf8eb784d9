"""The Kafka broker Backstop starts itself (infra/kafka.py): Apache Kafka's own `kafka.Kafka` JVM
in KRaft mode, driven here with a real client (confluent_kafka, librdkafka), never a mock.

One broker per test session (tests/conftest.py, `kafka_broker`); the launcher's test starts one
more, as a child of a ProcessGroup, to see the group keep it running."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.kafka import KAFKA_VERSION, KafkaBroker, cached_jars, kafka_bootstrap_servers
from infra.launcher import start_kafka_if_needed, wait_for
from infra.process_group import ProcessGroup


@pytest.fixture(autouse=True)
def _clear_cache():
    """Replaces the suite's autouse fixture that empties the Redis cache: nothing here needs
    Redis or a database."""


def new_topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.create_topics([NewTopic(name, partitions, 1)]).values()
    future.result(timeout=30)
    return name


def read_all(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[tuple]:
    """Every record of `topic` up to its end, as (partition, key, value), in offset order per
    partition: read with assign() and stopped at the end of each partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])  # offset 0: beginning
        at_end, records = set(), []
        deadline = time.monotonic() + 60
        while at_end != set(partitions) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                at_end.add(message.partition())
                continue
            records.append((message.partition(), message.key(), message.value()))
        assert at_end == set(partitions), f"did not reach the end of {topic}"
        return records
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, value=value, key=key)
    assert producer.flush(30) == 0


def test_the_broker_is_apache_kafkas_own_jvm_in_kraft_mode(kafka_broker):
    argv = psutil.Process(kafka_broker.pid).cmdline()
    assert Path(argv[0]).name == "java"
    assert argv[-2:] == ["kafka.Kafka", str(kafka_broker.config_path)]
    classpath = [Path(jar) for jar in argv[argv.index("-cp") + 1].split(os.pathsep)]
    jars = {jar.name for jar in classpath}
    assert {f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-server-{KAFKA_VERSION}.jar"} <= jars
    assert classpath == cached_jars()  # the fetched jars, nothing else
    config = dict(
        line.split("=", 1)
        for line in kafka_broker.config_path.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert config["process.roles"] == "broker,controller"  # KRaft, no ZooKeeper
    assert config["listeners"].startswith(f"PLAINTEXT://{kafka_broker.bootstrap_servers},")
    # The cluster answering on the port is this broker's (the id it formatted its log with).
    metadata = AdminClient({"bootstrap.servers": kafka_broker.bootstrap_servers}).list_topics(
        timeout=10
    )
    assert metadata.cluster_id == kafka_broker.cluster_id
    assert [(b.host, b.port) for b in metadata.brokers.values()] == [
        ("127.0.0.1", kafka_broker.port)
    ]


def test_records_go_round_trip_keeping_each_keys_order(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap, partitions=3)
    sent = [(f"k{i % 7}".encode(), f"v{i}".encode()) for i in range(600)]
    produce(bootstrap, topic, sent)
    got = read_all(bootstrap, topic)
    assert Counter((k, v) for _, k, v in got) == Counter(sent)
    for key in {k for k, _ in sent}:
        assert [v for _, k, v in got if k == key] == [v for k, v in sent if k == key]
        assert len({p for p, k, _ in got if k == key}) == 1  # one key, one partition


def test_a_read_committed_consumer_sees_committed_transactions_once_and_aborted_never(
    kafka_broker,
):
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap, partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    batches = {"first": 120, "aborted": 50, "second": 30}
    for name, count in batches.items():
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, key=str(i).encode(), value=f"{name}-{i}".encode())
        if name == "aborted":
            assert producer.flush(30) == 0  # on the broker's log (abort would drop them unsent)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    committed = [f"{n}-{i}".encode() for n in ("first", "second") for i in range(batches[n])]
    seen = [value for _, _, value in read_all(bootstrap, topic, "read_committed")]
    assert sorted(seen) == sorted(committed)  # each once, none of the aborted
    # The aborted records were written all the same: an uncommitted read sees them.
    everything = [value for _, _, value in read_all(bootstrap, topic, "read_uncommitted")]
    assert len(everything) == sum(batches.values())
    assert b"aborted-0" in everything


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap)
    config = {"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"}
    old = Producer(config)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, value=b"from the fenced producer")
    assert old.flush(30) == 0
    new = Producer(config)
    new.init_transactions(30)  # bumps the epoch: the old producer is a zombie now
    try:
        old.commit_transaction(30)
    except KafkaException as exc:
        error = exc.args[0]
    else:
        pytest.fail("the fenced producer committed")
    assert error.fatal() or error.code() in {KafkaError._FENCED, KafkaError.PRODUCER_FENCED}
    assert error.code() in {
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
    new.begin_transaction()
    new.produce(topic, value=b"from the new producer")
    new.commit_transaction(30)
    assert [v for _, _, v in read_all(bootstrap, topic)] == [b"from the new producer"]


@pytest.mark.parametrize("hard", [True, False], ids=["killed", "stopped"])
def test_a_broker_down_and_up_again_keeps_its_records_and_its_address(kafka_broker, hard):
    bootstrap = kafka_broker.bootstrap_servers
    topic = new_topic(bootstrap, partitions=2)
    before = [(f"k{i % 5}".encode(), f"before-{i}".encode()) for i in range(200)]
    produce(bootstrap, topic, before)  # acks=all: on the broker's log when flush returns
    old_pid = kafka_broker.pid
    kafka_broker.stop_for(1.0, hard=hard)
    assert kafka_broker.pid not in (None, old_pid)
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == "zombie"
    assert kafka_broker.bootstrap_servers == bootstrap  # same port, same data
    after = [(b"k", f"after-{i}".encode()) for i in range(20)]
    produce(bootstrap, topic, after)
    got = read_all(bootstrap, topic)
    assert Counter((k, v) for _, k, v in got) == Counter(before + after)


def test_a_configured_cluster_means_the_launcher_starts_no_broker(tmp_path, monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", " kafka-1:9092, kafka-2:9092 ")
    assert kafka_bootstrap_servers() == "kafka-1:9092,kafka-2:9092"
    group = ProcessGroup(tmp_path / "log", say=None)
    try:
        assert start_kafka_if_needed(group, tmp_path / "kafka") == "kafka-1:9092,kafka-2:9092"
        assert group.children == {}
        assert not (tmp_path / "kafka").exists()
    finally:
        group.stop()


def test_a_bad_bootstrap_setting_is_named(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka-1")
    with pytest.raises(Exception, match="KAFKA_BOOTSTRAP_SERVERS"):
        kafka_bootstrap_servers()


def test_the_launcher_keeps_its_broker_running(tmp_path, monkeypatch):
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    group = ProcessGroup(tmp_path / "log", say=None)
    try:
        bootstrap = start_kafka_if_needed(group, tmp_path / "kafka")
        child = group.children["kafka"]
        assert "kafka.Kafka" in psutil.Process(child.proc.pid).cmdline()
        topic = new_topic(bootstrap)
        produce(bootstrap, topic, [(b"k", b"kept")])
        first_pid = child.proc.pid
        os.kill(first_pid, signal.SIGKILL)  # the broker dies: the group starts it again
        wait_for(lambda: child.restarts == 1, 30, "the group to restart the broker")
        broker = KafkaBroker(tmp_path / "kafka")  # the same directory: the same address
        assert broker.bootstrap_servers == bootstrap
        wait_for(broker.answers, 60, "the restarted broker")
        assert [v for _, _, v in read_all(bootstrap, topic)] == [b"kept"]
        log = (tmp_path / "log" / "kafka.log").read_text()
        assert log.count("Kafka Server started") == 2  # the broker's own log, in the group's
    finally:
        group.stop()
