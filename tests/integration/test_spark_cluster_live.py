"""Stages on a real Spark standalone cluster: a master and two workers started from the pip
package's spark-class (tests/spark_standalone.py), the controller and node agents with
SPARK_MASTER pointing at it, and an adaptive wordcount job started through the API.

Once it has produced for WARMUP_S, while input flows, the job takes, 30 s apart:
- kill-executor on count: one executor JVM of count's primary is SIGKILLed. Expected: the
  stage's process lives on (same pid, no Backstop failure or action), Spark runs the lost tasks
  again on its other executor, and the fault's episode (action spark-retry) is measured;
- kill-worker on count: the Spark worker that runs an executor of count's primary is SIGKILLed
  with its executors (a lost worker host). Expected: the same, on the one worker left;
- kill-driver on count: the stage's process and its driver JVM are killed. Expected: the standby
  (an application with executors of its own) is promoted.
The final counts equal the ground truth computed in plain Python from the input, and every
episode's audit finds nothing lost or duplicated. The figures of each episode are printed.

Marked slow (about 5 minutes: the cluster and two applications of executors on 2 cores). Warm
spares are off for this job (policy warm_spares_per_node=0): each spare would be an application
holding executors of its own.
"""

from __future__ import annotations

import json
import time

import pytest
from django.utils import timezone

from console.models import ControlDecision, FaultInjection, Policy, RecoveryEpisode, Replica
from console.redis import redis_client
from console.roles import OPERATOR
from infra.launcher import wait_for
from spark_runtime import keys
from tests.cluster import Cluster, prepare
from tests.factories import UserFactory
from tests.integration.live import (
    assert_episodes_audited_exact,
    inject,
    launch,
    results,
    wait_for_exact_results,
)
from tests.spark_standalone import SparkStandalone

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

LINES = 12000  # 200 s of input at 60 lines/s: every fault comes while input flows
WARMUP_S = 30.0  # the first batches of a new application are slow (executors, Python workers)
FAULT_GAP_S = 30.0
RECOVERY_KINDS = ("failure", "promote", "restart-stage", "restart-job", "give-up")


@pytest.fixture
def spark_cluster(tmp_path):
    cluster = SparkStandalone(tmp_path / "spark", workers=2, cores=4)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def backstop_on_spark(transactional_db, tmp_path, settings, spark_cluster):
    """The controller, beat and three node agents, their stages running on `spark_cluster`."""
    settings.CONTROLLER_DISPATCH = True
    prepare()
    UserFactory(username="opal", role=OPERATOR)
    Policy.objects.create(warm_spares_per_node=0, reason="spark cluster test: no spares")
    running = Cluster(tmp_path / "backstop", env={"SPARK_MASTER": spark_cluster.url})
    try:
        running.start_all()
        yield running
    finally:
        running.stop()


def primary_of_count(job) -> Replica:
    wait_for(
        lambda: (
            Replica.objects.filter(job=job, stage="count", role="primary")
            .exclude(state__in=("failed", "stopped"))
            .count()
            == 1
        ),
        60,
        "one primary of count",
    )
    return (
        Replica.objects.filter(job=job, stage="count", role="primary")
        .exclude(state__in=("failed", "stopped"))
        .get()
    )


def spark_app(client, job, replica: Replica) -> str:
    raw = client.hget(keys.replicas(job.key), replica.local_id)
    return json.loads(raw).get("spark_app", "") if raw else ""


def episode_of(job, fault: FaultInjection, action: str) -> RecoveryEpisode:
    wait_for(
        lambda: RecoveryEpisode.objects.filter(job=job, fault=fault, action=action).exists(),
        60,
        f"a {action} episode after {fault.kind}",
    )
    return RecoveryEpisode.objects.get(job=job, fault=fault, action=action)


def produced(client, job) -> int:
    return sum(results(client, job.key).values())


def test_executor_and_worker_losses_are_absorbed_by_spark_and_results_stay_exact(
    backstop_on_spark, spark_cluster
):
    client = redis_client(decode_responses=False)
    job = launch("adaptive", LINES, name="it-spark-cluster")
    wait_for(lambda: produced(client, job) > 0, 240, "first output")
    time.sleep(WARMUP_S)
    primary = primary_of_count(job)
    app = spark_app(client, job, primary)
    assert app.startswith("app-"), f"count's primary runs Spark {app!r}, not on the cluster"
    master = spark_cluster.state()
    assert app in {a["id"] for a in master["activeapps"]}

    for kind in ("kill-executor", "kill-worker"):
        before = produced(client, job)
        fault = inject(job, {"kind": kind, "target_operator": "count"})
        episode = episode_of(job, fault, "spark-retry")
        assert f"killed Spark {kind.split('-')[1]} of {app}" in episode.notes
        wait_for(lambda b=before: produced(client, job) > b + 100, 120, f"output after {kind}")
        # Faults FAULT_GAP_S apart, as in the benchmark: each is measured up to the next.
        time.sleep(max(0.0, FAULT_GAP_S - (timezone.now() - fault.injected_at).total_seconds()))
        # Spark absorbed the loss: the same driver process, no Backstop failure or action.
        assert primary_of_count(job).pid == primary.pid
        acted = ControlDecision.objects.filter(
            job=job, at__gte=fault.injected_at, kind__in=RECOVERY_KINDS
        )
        assert not acted.exists(), [d.reason for d in acted]
    assert len(spark_cluster.worker_pids()) == 1  # the killed worker stays down

    # The driver itself: Backstop's own recovery (the standby's application takes over).
    fault = inject(job, {"kind": "kill-driver", "target_operator": "count"})
    episode_of(job, fault, "promote")

    wait_for_exact_results(client, job, LINES)
    assert_episodes_audited_exact(job)
    for episode in RecoveryEpisode.objects.filter(job=job).order_by("detected_at"):
        print(
            f"{episode.fault.kind}: {episode.action}, downtime {episode.downtime_s} s, "
            f"recovery {episode.recovery_time_s} s, watched {episode.watched_s} s, "
            f"lost {episode.lost}, duplicates {episode.duplicates}"
        )
