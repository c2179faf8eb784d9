"""The kafka-broker fault through the whole system: asked through the API, carried out by the
process that keeps the session's broker (infra/kafka_outage.py), on an adaptive wordcount that
reads and writes Kafka while its generator keeps writing.

The broker really stops (its process gone, its port closed) for 10 s and starts again on the
same data and ports. While it is down, the job's stats hash names the cause (`kafka:source`);
after it is back the job goes on by itself (no replica restarted, no recovery episode), the
cause is cleared, and the first new output comes within 10 s of the broker's return (measured
from the keeper's `back_at`, when the broker answered an AdminClient again, to the first batch
with output that the job's progress stream records after it). The counts on the output topic
and in Redis equal the ground truth computed in plain Python from the input topic, with no
(word, version) written twice."""

from __future__ import annotations

import json
import time

import pytest

from console.models import FaultInjection, Job, RecoveryEpisode, Replica
from console.redis import redis_client
from console.roles import OPERATOR
from infra.kafka import port_open
from infra.kafka_outage import DOWN, UP, outage, registration
from infra.launcher import wait_for
from spark_runtime import keys
from spark_runtime.kafka_source import SOURCE_CAUSE
from spark_runtime.progress import read_progress
from tests.factories import UserFactory
from tests.integration.live import api, inject, results
from tests.integration.test_kafka_live import expected_counts, output_counts
from tests.kafka_topics import committed

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.django_db(transaction=True),
    pytest.mark.kafka,
]

RATE, LINES = 50, 3000  # a minute of input: it goes on through the outage and after it
DOWN_S = 10
FIRST_OUTPUT_GOAL_S = 10.0


@pytest.fixture(autouse=True)
def operator_user(transactional_db):
    return UserFactory(username="opal", role=OPERATOR)


def first_output_after(client, job: Job, since: float, timeout_s: float) -> float:
    """When the job's final stage first wrote results after `since` (its progress stream)."""
    found: list[float] = []

    def written() -> bool:
        outputs = [r.at for r in read_progress(client, job.key, since) if r.is_output]
        found[:] = [min(outputs)] if outputs else []
        return bool(found)

    wait_for(written, timeout_s, "the job's first output after the broker's return", poll_s=0.2)
    return found[0]


def test_the_broker_stops_and_returns_and_the_job_goes_on_exactly(cluster, kafka_broker):
    bootstrap = kafka_broker.bootstrap_servers
    response = api().post(
        "/api/jobs/",
        {"name": "it-broker", "topology": "wordcount", "strategy": "adaptive",
         "params": {"rate": RATE, "count": LINES},
         "source": {"kind": "kafka", "topic": "it-broker-lines"},
         "sink": {"kind": "kafka", "topic": "it-broker-counts"}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "job running")
    client, raw = redis_client(), redis_client(decode_responses=False)
    wait_for(lambda: sum(results(raw, job.key).values()) > 0, 180, "the job's first results")
    assert registration(client, bootstrap).pid == kafka_broker.pid

    fault = inject(job, {"kind": "kafka-broker", "params": {"duration_s": DOWN_S}})
    assert fault.params == {"duration_s": float(DOWN_S), "hard": True}
    assert "SIGKILL to the Kafka broker" in fault.outcome_detail

    # The keeper takes it down: the process is gone and nothing listens on its port.
    wait_for(lambda: getattr(outage(client, bootstrap), "state", None) == DOWN, 10, "broker down")
    down = outage(client, bootstrap)
    assert down.fault == fault.pk
    wait_for(lambda: kafka_broker.pid is None, 30, "the broker's process to end")
    assert not port_open(kafka_broker.port)
    wait_for(lambda: registration(client, bootstrap).pid is None, 5, "registered without a pid")
    # A second outage while this one holds the broker down is refused (one at a time).
    again = api().post(f"/api/jobs/{job.pk}/faults/", {"kind": "kafka-broker"}, format="json")
    assert again.status_code == 409, again.content
    assert "already down for fault" in again.json()["error"]["detail"]

    causes = set()
    while (current := outage(client, bootstrap)).state != UP:
        assert time.time() < down.until + 120, "the broker did not come back"
        cause = client.hget(keys.stats(job.key), SOURCE_CAUSE)
        if cause and current.state == DOWN:
            causes.add(cause)
        time.sleep(0.2)
    back_at = current.back_at
    assert back_at - current.down_at >= DOWN_S
    assert kafka_broker.answers() and port_open(kafka_broker.port)
    assert any(f"broker {bootstrap} does not answer" in c for c in causes), causes

    first = first_output_after(client, job, back_at, 60)
    print(f"first output {first - back_at:.1f} s after the broker answered again "
          f"(down {current.back_at - current.down_at:.1f} s)")  # fmt: skip
    assert first - back_at <= FIRST_OUTPUT_GOAL_S
    wait_for(lambda: not client.hexists(keys.stats(job.key), SOURCE_CAUSE), 15, "cause cleared")

    def drained() -> bool:
        expected = expected_counts(bootstrap, "it-broker-lines")
        return sum(expected.values()) > 0 and results(raw, job.key) == expected

    wait_for(lambda: len(committed(bootstrap, "it-broker-lines")) >= LINES, 180, "all input")
    wait_for(drained, 180, "the results to match the input", poll_s=3)
    assert not client.hexists(keys.stats(job.key), SOURCE_CAUSE)

    # Input kept coming while the broker was down (the generator's records carry their time).
    lines = [json.loads(value) for *_at, value in committed(bootstrap, "it-broker-lines")]
    assert len(lines) == LINES
    during = [r for r in lines if current.down_at * 1000 < r["ts"] < current.back_at * 1000]
    assert len(during) >= RATE * DOWN_S * 0.5, len(during)

    expected = expected_counts(bootstrap, "it-broker-lines")
    got, repeated = output_counts(bootstrap, "it-broker-counts")
    assert got == expected
    assert repeated == 0
    assert results(raw, job.key) == expected
    # The job went on by itself: nothing failed, nothing was restarted or promoted.
    assert not RecoveryEpisode.objects.filter(job=job).exists()
    assert not Replica.objects.filter(job=job, state=Replica.State.FAILED).exists()
    assert FaultInjection.objects.get(pk=fault.pk).outcome == FaultInjection.Outcome.INJECTED
