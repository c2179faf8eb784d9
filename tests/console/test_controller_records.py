"""What the controller writes about failures: why a replica failed, and a promotion that
overtakes a restart."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from kombu.exceptions import OperationalError

from console.models import ControlDecision, FaultInjection, Job, RecoveryEpisode, Replica
from console.services import faults
from console.services.control.record import (
    OWN_REPORT_FRESH_S,
    record_failure,
    record_promotion_over_restart,
)
from infra import keys as control_keys
from infra import tasks
from spark_runtime import keys as data_keys
from spark_runtime.failure_text import failure_cause
from spark_runtime.replicas import (
    HeartbeatMissed,
    HeartbeatSeen,
    KillReplica,
    PromoteStandby,
    ReplicaSpec,
    RestartStage,
)
from tests.factories import FaultFactory, NodeFactory, ReplicaFactory, make_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_flushed")]


def test_a_standby_overtaking_a_restart_turns_the_open_restart_episode_into_a_promotion():
    job = make_job(status=Job.Status.RUNNING, strategy="adaptive")
    episode = RecoveryEpisode.objects.create(
        job=job,
        strategy=job.strategy,
        stage="count",
        action=RecoveryEpisode.Action.RESTART_STAGE,
        detected_at=timezone.now(),
        notes="count-2 on node-2: ProcessExited",
        phases={"detected": 10.0, "commanded": 10.5, "replica": "count-2", "process_started": 12},
    )
    node = NodeFactory(name="node-2")
    restarted, standby = (
        Replica.objects.create(
            job=job,
            replica_id=Replica.full_id(job.key, local_id),
            stage="count",
            node=node,
            role=role,
            state=state,
        )
        for local_id, role, state in (
            ("count-2", Replica.Role.PRIMARY, Replica.State.STARTING),
            ("count-3", Replica.Role.STANDBY, Replica.State.RUNNING),
        )
    )
    event = HeartbeatSeen("count-3", 15.0, {"stage": "count", "state": "running"})
    actions = [KillReplica("count-2"), PromoteStandby("count-3", "count")]
    record_promotion_over_restart(job, event, actions)
    episode.refresh_from_db()
    assert episode.action == RecoveryEpisode.Action.PROMOTE
    # Once the episode says promote, the abandoned restart is no longer the stage's primary
    # (a reader saw it as the one primary until the agent's kill was sent).
    restarted.refresh_from_db()
    assert restarted.state == Replica.State.STOPPED and restarted.ended_at is not None
    standby.refresh_from_db()
    assert standby.state == Replica.State.RUNNING
    assert "restart overtaken by count-3" in episode.notes
    # Its phases are now the promoted standby's: the abandoned restart's start is not one.
    assert episode.phases == {"detected": 10.0, "commanded": 10.5, "replica": "count-3"}
    decision = ControlDecision.objects.get(job=job, kind=ControlDecision.Kind.PROMOTE)
    assert decision.replica_id == "count-3" and decision.stage == "count"
    assert "caught up before the restarted primary produced output" in decision.reason


# What Spark 4 raises when a foreachBatch function fails (abridged from a stage's log).
SPARK_ERROR = """An exception was raised by the Python Proxy. Return Message: Traceback (most \
recent call last):
  File "/app/spark_runtime/runtime.py", line 115, in _write_batch
    raise InjectedFault(f"injected operator exception in stage {self.stage}")
spark_runtime.runtime.InjectedFault: injected operator exception in stage count
"""


# A PySpark process's stderr when the JVM could not start Python workers (abridged).
PY4J_ERROR = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/py4j/protocol.py", line 327, in get_return_value
    raise Py4JJavaError(
py4j.protocol.Py4JJavaError: An error occurred while calling o73.load.
: java.io.IOException: Cannot run program "/venv/bin/backstop-python-worker": error=2, No such \
file or directory
	at java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)
Caused by: java.io.IOException: error=2, No such file or directory
	... 22 more
"""


def test_the_cause_of_a_failed_query_is_the_last_python_exception_line():
    assert failure_cause(SPARK_ERROR) == (
        "spark_runtime.runtime.InjectedFault: injected operator exception in stage count"
    )
    assert failure_cause("Connection refused\nmore") == "Connection refused"
    assert failure_cause("") == "unknown error"
    assert len(failure_cause("ValueError: " + "x" * 1000)) == 300
    # py4j's wrapper says nothing; the Java exception after it does (a dry run's stderr).
    assert failure_cause(PY4J_ERROR) == (
        'java.io.IOException: Cannot run program "/venv/bin/backstop-python-worker": error=2, '
        "No such file or directory"
    )


def fail_count_1(client, job: Job, entry: dict) -> ControlDecision:
    """count-1 went silent after writing `entry`; the supervisor restarts it."""
    client.hset(data_keys.replicas(job.key), "count-1", json.dumps(entry))
    spec = ReplicaSpec(job.key, "wordcount", "count", "primary", "count-1", "node-1")
    record_failure(
        job, client, HeartbeatMissed("count-1", time.time()), [RestartStage(spec)], time.time()
    )
    return ControlDecision.objects.get(job=job, kind=ControlDecision.Kind.FAILURE)


def test_a_silent_replica_that_reported_its_failed_query_is_recorded_with_the_cause(redis_conn):
    # The stage writes the cause, then takes seconds to exit: its silence is seen first.
    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    cause = failure_cause(SPARK_ERROR)
    failure = fail_count_1(
        redis_conn, job, {"state": "failed", "error": cause, "updated": time.time() - 1}
    )
    assert failure.reason == f"count-1: query failed: {cause}"
    assert failure.detail["error_tail"].startswith(f"query failed: {cause}")


def test_an_old_report_is_ignored_and_the_agents_exit_comes_first(redis_conn):
    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    stale = {"state": "failed", "error": "ValueError: old", "updated": time.time() - 60}
    assert OWN_REPORT_FRESH_S < 60
    assert fail_count_1(redis_conn, job, stale).reason == "count-1: heartbeat missed"
    ControlDecision.objects.all().delete()
    redis_conn.hset(control_keys.exits(job.key), "count-1", json.dumps({"returncode": "1"}))
    fresh = {"state": "failed", "error": "ValueError: new", "updated": time.time()}
    assert fail_count_1(redis_conn, job, fresh).reason == (
        "count-1: exited with code 1 (query failed): ValueError: new"
    )


def count_primary(job: Job) -> Replica:
    """A running primary of stage count, which runs operator count."""
    job.operators.filter(name="count").update(stage="count")
    return ReplicaFactory(job=job, node=NodeFactory(name="node-1"), replica_id=f"{job.key}/count-1")


def test_a_kill_is_recorded_injected_before_it_is_sent_so_its_failure_finds_it(
    redis_conn, monkeypatch
):
    # The controller can see the failure a kill causes before faults.inject returns: here the
    # failure is recorded while the kill is being sent (CI saw an episode name no fault).
    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    count_primary(job)
    fault = FaultFactory(job=job, kind=FaultInjection.Kind.KILL_DRIVER, target_operator="count")
    seen_when_sent = []

    def send_and_fail(task, *args, **kwargs):
        seen_when_sent.append(FaultInjection.objects.get(pk=fault.pk).outcome)
        fail_count_1(redis_conn, job, {"state": "running", "updated": time.time()})

    monkeypatch.setattr(tasks, "send", send_and_fail)
    injected = faults.inject(fault)
    assert seen_when_sent == [FaultInjection.Outcome.INJECTED]
    assert injected.outcome == FaultInjection.Outcome.INJECTED
    episode = RecoveryEpisode.objects.get(job=job)
    assert episode.fault == fault
    assert injected.injected_at <= episode.detected_at


def test_a_slow_driver_fault_tells_the_primary_its_delay_and_for_how_long(redis_conn):
    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    count_primary(job)
    fault = FaultFactory(
        job=job,
        kind=FaultInjection.Kind.SLOW_DRIVER,
        target_operator="count",
        params={"delay_s": 1.5, "duration_s": 20.0},
    )
    injected = faults.inject(fault)
    assert injected.outcome == FaultInjection.Outcome.INJECTED
    assert injected.outcome_detail == "each batch of count-1 1.5 s longer for 20 s"
    (sent,) = redis_conn.lrange(data_keys.control(job.key, "count-1"), 0, -1)
    assert json.loads(sent) == {
        "cmd": "fault", "kind": "slow_batches", "delay_s": 1.5, "duration_s": 20.0,
    }  # fmt: skip


def test_a_kill_that_cannot_be_sent_is_recorded_failed(monkeypatch):
    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    count_primary(job)
    fault = FaultFactory(job=job, kind=FaultInjection.Kind.KILL_DRIVER, target_operator="count")

    def broker_down(task, *args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379")

    monkeypatch.setattr(tasks, "send", broker_down)
    failed = faults.inject(fault)
    assert failed.outcome == FaultInjection.Outcome.FAILED
    assert "not sent (Error 111" in failed.outcome_detail
    assert failed.injected_at is None


def test_the_episode_names_a_recent_injected_fault_and_not_an_old_or_refused_one(redis_conn):
    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    now = timezone.now()
    old, refused, recent = (
        FaultInjection.objects.create(
            job=job, kind=FaultInjection.Kind.KILL_DRIVER, target_operator="count", outcome=outcome
        )
        for outcome in (
            FaultInjection.Outcome.INJECTED,
            FaultInjection.Outcome.REFUSED,
            FaultInjection.Outcome.INJECTED,
        )
    )
    FaultInjection.objects.filter(pk=old.pk).update(
        requested_at=now - timedelta(seconds=90), injected_at=now - timedelta(seconds=89)
    )
    FaultInjection.objects.filter(pk=recent.pk).update(
        requested_at=now - timedelta(seconds=5), injected_at=now - timedelta(seconds=4)
    )
    assert FaultInjection.behind_failure(job, now) == recent
    # One injected after the failure was seen did not cause it.
    assert FaultInjection.behind_failure(job, now - timedelta(seconds=4.5)) is None
    FaultInjection.objects.filter(pk=recent.pk).delete()
    assert FaultInjection.behind_failure(job, now) is None
    assert FaultInjection.behind_failure(job, now - timedelta(seconds=60)) == old


def test_a_restart_episode_carries_the_marks_of_the_controller_and_the_stage(redis_conn):
    from console.policy.recovery_phases import phase_seconds
    from console.services.control.record import mark_commanded
    from console.services.recovery import record_phases

    job = make_job(status=Job.Status.RUNNING, strategy="local-restart")
    ReplicaFactory(
        job=job, replica_id=Replica.full_id(job.key, "count-1"), stage="count", node=NodeFactory()
    )
    spec = ReplicaSpec(job.key, "wordcount", "count", "primary", "count-2", "node-1")
    seen = time.time()
    episode = record_failure(
        job,
        redis_conn,
        HeartbeatMissed("count-1", seen),
        [RestartStage(spec)],
        seen - 30,
        decided_at=seen + 0.2,
    )
    mark_commanded(episode, seen + 0.5)
    # The restarted replica's own entry, as spark_runtime/stage.py writes it.
    entry = {"started_at": seen + 2.0, "queries_started_at": seen + 6.0, "first_batch_at": seen + 9}
    redis_conn.hset(data_keys.replicas(job.key), "count-2", json.dumps(entry))
    record_phases(episode, redis_conn, seen - 3.0, [seen - 4.0, seen + 8.0, seen + 9.5, seen + 12])
    episode.refresh_from_db()
    assert episode.phases["replica"] == "count-2"
    assert phase_seconds(episode.phases) == pytest.approx({
        "detection": 3.0, "decision": 0.2, "command": 0.3, "process start": 1.5,
        "state restore": 4.0, "catch-up": 3.0, "first output": 0.5,
    })  # fmt: skip
