"""kill-executor and kill-worker on the controller's side: a stage not on a Spark cluster is
refused with the reason, and an agent's report of a kill opens one measured episode (the live
run on a standalone cluster is tests/integration/test_spark_cluster_live.py)."""

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from console.models import FaultInjection, Job, Operator, RecoveryEpisode
from console.services.control.observe import read_agent_events
from console.services.faults import (
    SPARK_KILL_REPORT_TIMEOUT_S,
    expire_unreported_spark_kills,
    inject,
)
from infra import keys
from spark_runtime import keys as data_keys
from tests.factories import FaultFactory, NodeFactory, ReplicaFactory, make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    job = make_job(status=Job.Status.RUNNING, name="spark-faults")
    Operator.objects.filter(job=job, name__in=("split", "count")).update(stage="count")
    return job


@pytest.fixture(autouse=True)
def job_keys_cleared(redis_conn, job):
    yield
    redis_conn.delete(
        data_keys.replicas(job.key), keys.agent_events(), keys.agent_events_cursor(job.key)
    )


def running_primary(job, client, spark_app: str):
    node = NodeFactory(name="node-9")
    replica = ReplicaFactory(job=job, node=node, replica_id=f"{job.key}/count-p1")
    client.hset(data_keys.replicas(job.key), "count-p1", json.dumps({"spark_app": spark_app}))
    return replica


@pytest.mark.parametrize("kind", ["kill-executor", "kill-worker"])
def test_a_stage_in_local_mode_has_nothing_to_kill_and_the_fault_says_why(job, redis_conn, kind):
    running_primary(job, redis_conn, "local-1764000000000")
    fault = inject(FaultFactory(job=job, kind=kind, target_operator="count"))
    assert fault.outcome == FaultInjection.Outcome.FAILED
    assert "application local-1764000000000" in fault.outcome_detail
    assert f"{kind} needs SPARK_MASTER=spark://" in fault.outcome_detail
    assert not fault.episodes.exists()


def test_a_fault_before_the_primary_reported_its_application_fails(job, redis_conn):
    fault = inject(FaultFactory(job=job, kind="kill-executor", target_operator="count"))
    assert fault.outcome == FaultInjection.Outcome.FAILED
    assert "application unknown" in fault.outcome_detail


def agent_reports(client, job, kind: str, fault: FaultInjection, detail: str) -> None:
    client.xadd(
        keys.agent_events(),
        {"kind": kind, "node": "node-9", "fault": fault.kind, "detail": detail,
         "fault_id": str(fault.pk), "job": job.key, "at": str(time.time())},
    )  # fmt: skip


def test_a_reported_kill_opens_one_spark_retry_episode_for_the_stage(job, redis_conn):
    fault = FaultFactory(job=job, kind="kill-worker", target_operator="count", outcome="injected")
    detail = "killed Spark worker of app-1: pids [11, 12]"
    agent_reports(redis_conn, job, "spark-killed", fault, detail)
    read_agent_events(redis_conn, job)
    # The same report read again (a controller killed before it saved its cursor) adds nothing.
    redis_conn.delete(keys.agent_events_cursor(job.key))
    read_agent_events(redis_conn, job)
    (episode,) = RecoveryEpisode.objects.filter(job=job)
    assert (episode.fault, episode.stage, episode.action) == (fault, "count", "spark-retry")
    assert episode.notes == detail
    fault.refresh_from_db()
    assert fault.outcome == "injected" and detail in fault.outcome_detail


def test_an_agent_without_the_applications_executors_refuses(job, redis_conn):
    fault = FaultFactory(job=job, kind="kill-executor", target_operator="count", outcome="injected")
    agent_reports(redis_conn, job, "refused", fault, "no executor of Spark application app-1 runs")
    read_agent_events(redis_conn, job)
    fault.refresh_from_db()
    assert fault.outcome == FaultInjection.Outcome.REFUSED
    assert "no executor of Spark application app-1" in fault.outcome_detail
    assert not RecoveryEpisode.objects.filter(job=job).exists()


def test_a_fault_on_a_cluster_is_sent_once_to_the_primarys_agent(job, redis_conn):
    running_primary(job, redis_conn, "app-20261124000000-0001")
    queue = "node.node-9"  # Celery's list of the node agent's queue in the broker
    redis_conn.delete(queue)
    try:
        fault = FaultFactory(job=job, kind="kill-worker", target_operator="count")
        inject(fault)
        inject(FaultInjection.objects.get(pk=fault.pk))  # the inject task delivered again
        assert redis_conn.llen(queue) == 1
        fault.refresh_from_db()
        assert fault.outcome == FaultInjection.Outcome.INJECTED
        assert "Spark worker of application app-20261124000000-0001" in fault.outcome_detail
    finally:
        redis_conn.delete(queue)


def test_a_kill_no_agent_reported_on_fails_after_the_timeout(job, redis_conn):
    fault = FaultFactory(
        job=job, kind="kill-executor", target_operator="count", outcome="injected",
        injected_at=timezone.now() - timedelta(seconds=SPARK_KILL_REPORT_TIMEOUT_S + 1),
    )  # fmt: skip
    recent = FaultFactory(
        job=job, kind="kill-executor", target_operator="count", outcome="injected",
        injected_at=timezone.now(),
    )  # fmt: skip
    read_agent_events(redis_conn, job)  # the events say nothing of either
    assert FaultInjection.objects.get(pk=fault.pk).outcome == FaultInjection.Outcome.INJECTED
    expire_unreported_spark_kills(job)  # what every policy cycle does first
    fault.refresh_from_db()
    recent.refresh_from_db()
    assert fault.outcome == FaultInjection.Outcome.FAILED
    assert "no report from the node agent within 60 s" in fault.outcome_detail
    assert recent.outcome == FaultInjection.Outcome.INJECTED
