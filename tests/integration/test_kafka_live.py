"""A job on Kafka through the whole system: created through the API with a Kafka source and
sink, its generator feeding the topic, three node agents, the real controller, a real broker.

An adaptive wordcount reads a 3-partition topic and writes its counts to a Kafka topic; the key
stage's primary is killed and its hot standby promoted (the promotion's initTransactions fences
the dead primary's producer at the broker). The counts on the output topic, read by a
read_committed consumer, and in Redis equal the ground truth computed in plain Python from the
input topic, with no (key, version) twice; the recovery episode's audit (which reads the input
from Kafka) finds nothing lost or duplicated."""

from __future__ import annotations

import collections
import json

import pytest

from console.models import Job, RecoveryEpisode
from console.redis import redis_client
from console.roles import OPERATOR
from infra.launcher import wait_for
from spark_runtime import keys
from tests.factories import UserFactory
from tests.integration.live import (
    RATE,
    api,
    assert_episodes_audited_exact,
    inject,
    results,
    wait_for_caught_up_standby,
)
from tests.kafka_topics import committed

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True), pytest.mark.kafka]

LINES = 1200


@pytest.fixture(autouse=True)
def operator_user(transactional_db):
    return UserFactory(username="opal", role=OPERATOR)


def expected_counts(bootstrap: str, topic: str) -> collections.Counter:
    counts = collections.Counter()
    for *_where, value in committed(bootstrap, topic):
        counts.update(json.loads(value)["text"].split())
    return counts


def output_counts(bootstrap: str, topic: str) -> tuple[collections.Counter, int]:
    """The newest count per word on the output topic and the (word, version) pairs repeated."""
    newest: dict[str, tuple[str, int]] = {}
    seen = collections.Counter()
    for _p, _o, key, value in committed(bootstrap, topic):
        record = json.loads(value)
        seen[(key, record["version"])] += 1
        word = key.decode()
        if word not in newest or record["version"] > newest[word][0]:
            newest[word] = (record["version"], int(record["value"]))
    repeated = sum(n - 1 for n in seen.values() if n > 1)
    return collections.Counter({w: c for w, (_v, c) in newest.items()}), repeated


def test_a_job_on_kafka_fails_over_exactly_once_on_its_output_topic(cluster, kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    response = api().post(
        "/api/jobs/",
        {"name": "it-kafka", "topology": "wordcount", "strategy": "adaptive",
         "params": {"rate": RATE, "count": LINES},
         "source": {"kind": "kafka", "topic": "it-lines"},
         "sink": {"kind": "kafka", "topic": "it-counts"}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    assert response.json()["source"] == {"kind": "kafka", "topic": "it-lines"}
    job = Job.objects.get(pk=response.json()["id"])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "job running")
    client = redis_client(decode_responses=False)
    # The generator writes the topic, not the job's Redis input stream.
    wait_for(lambda: client.llen(keys.kafka_plans(job.key)) > 1, 120, "a plan of the Kafka input")
    assert not client.exists(keys.input_stream(job.key))
    wait_for_caught_up_standby(job, "count")
    inject(job, {"kind": "kill-driver", "target_operator": "count"})
    wait_for(lambda: RecoveryEpisode.objects.filter(job=job).exists(), 60, "a recovery")
    assert RecoveryEpisode.objects.get(job=job).action == "promote"

    def drained() -> bool:
        expected = expected_counts(bootstrap, "it-lines")
        return sum(expected.values()) > 0 and results(client, job.key) == expected

    wait_for(lambda: len(committed(bootstrap, "it-lines")) >= LINES, 180, "all input")
    wait_for(drained, 240, "the results to match the input", poll_s=3)
    expected = expected_counts(bootstrap, "it-lines")
    got, repeated = output_counts(bootstrap, "it-counts")
    assert got == expected
    assert repeated == 0
    # The replicas' lag on the input topic is published per partition.
    lags = [json.loads(v) for v in client.hgetall(keys.kafka_lag(job.key)).values()]
    assert lags and all(len(entry["partitions"]) == 3 for entry in lags)
    assert_episodes_audited_exact(job)
    assert api().get(f"/api/jobs/{job.pk}/").json()["sink"]["topic"] == "it-counts"
