"""/metrics for jobs reading Kafka: each partition's lag as the stage's primary published it,
and whether the source reads. Scraped like Prometheus would and parsed from the text format;
the lag entries are written into the real Redis the way the data plane writes them, and the
expected values are computed here by hand."""

from __future__ import annotations

import json
import time

import pytest

from console.models import Job, Replica
from console.redis import redis_client
from spark_runtime import keys as data_keys
from tests.factories import NodeFactory, ReplicaFactory, make_job
from tests.web.test_metrics import TOKEN, scrape

pytestmark = pytest.mark.django_db


def lag_entry(stage: str, partitions: dict[int, tuple[int, int]]) -> str:
    """A lag entry as KafkaPlanReader._publish_lag writes it."""
    return json.dumps(
        {
            "stage": stage,
            "topic": "clicks",
            "at": time.time(),
            "partitions": {str(p): [read, end] for p, (read, end) in partitions.items()},
        }
    )


@pytest.fixture
def jobs(settings):
    """Two live jobs reading Kafka (one whose broker does not answer) and one that does not."""
    settings.METRICS_TOKEN = TOKEN
    node = NodeFactory(name="metrics-node")
    conn = redis_client()
    made = {}
    for name, source in (
        ("clicks-wc", {"kind": "kafka", "topic": "clicks"}),
        ("orders-wc", {"kind": "kafka", "topic": "orders"}),
        ("plain", {}),
    ):
        job = make_job(Job.Status.RUNNING, name=name)
        Job.objects.filter(pk=job.pk).update(source=source)
        job.refresh_from_db()
        made[name] = job
        for local, role in (("split-1", Replica.Role.PRIMARY), ("split-2", Replica.Role.STANDBY)):
            ReplicaFactory(job=job, node=node, stage="split", role=role,
                           replica_id=Replica.full_id(job.key, local))  # fmt: skip
    clicks, orders = made["clicks-wc"], made["orders-wc"]
    conn.hset(
        data_keys.kafka_lag(clicks.key),
        mapping={
            "split-1": lag_entry("split", {0: (100, 900), 1: (450, 450), 2: (7, 10)}),
            "split-2": lag_entry("split", {0: (0, 900), 1: (0, 450), 2: (0, 10)}),  # standby
        },
    )
    conn.hset(data_keys.kafka_lag(orders.key), "split-1", lag_entry("split", {0: (5, 25)}))
    conn.hset(
        data_keys.stats(orders.key),
        "kafka:source",
        "broker 127.0.0.1:9092 does not answer: KafkaError{code=_TRANSPORT}",
    )
    # The job without Kafka has a stray field that must not make it a Kafka job.
    conn.hset(data_keys.stats(made["plain"].key), "kafka:source", "not its")
    yield made
    for job in made.values():
        data_keys.delete_job_keys(conn, job.key)


def test_lag_per_partition_of_the_primary_and_whether_the_source_reads(client, jobs):
    metrics = scrape(client)
    clicks, orders = jobs["clicks-wc"], jobs["orders-wc"]
    lag = {
        (s.labels["job_id"], s.labels["name"], s.labels["stage"], s.labels["partition"]): s.value
        for s in metrics["backstop_kafka_lag_records"]
    }
    assert lag == {
        (str(clicks.pk), "clicks-wc", "split", "0"): 900 - 100,
        (str(clicks.pk), "clicks-wc", "split", "1"): 450 - 450,
        (str(clicks.pk), "clicks-wc", "split", "2"): 10 - 7,
        (str(orders.pk), "orders-wc", "split", "0"): 25 - 5,
    }
    ok = {
        (s.labels["job_id"], s.labels["name"]): s.value for s in metrics["backstop_kafka_source_ok"]
    }
    assert ok == {(str(clicks.pk), "clicks-wc"): 1.0, (str(orders.pk), "orders-wc"): 0.0}
    # The broker answers again: the source deletes its cause and reads.
    redis_client().hdel(data_keys.stats(orders.key), "kafka:source")
    ok = {s.labels["job_id"]: s.value for s in scrape(client)["backstop_kafka_source_ok"]}
    assert ok == {str(clicks.pk): 1.0, str(orders.pk): 1.0}


def test_a_job_that_stopped_is_not_exported(client, jobs):
    Job.objects.filter(pk=jobs["orders-wc"].pk).update(status=Job.Status.STOPPED)
    metrics = scrape(client)
    assert {s.labels["name"] for s in metrics["backstop_kafka_lag_records"]} == {"clicks-wc"}
    assert {s.labels["name"] for s in metrics["backstop_kafka_source_ok"]} == {"clicks-wc"}
