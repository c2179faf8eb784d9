"""The soak picks the target of a job fault as the fault service's table of kinds says: an
operator whose stage has a live replica in the role the kind hits, a node with a live replica
of the job, or no target (the job's Kafka broker). The faults are recorded through the real
service; the live run is tests/bench/test_soak.py (slow)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from bench.soak.faults import FaultPlay
from bench.soak.schedule import JOB_FAULTS, KAFKA_FAULTS, event_rng
from console.models import Job, Operator, Replica
from console.services.faults import FAULT_KINDS
from tests.factories import NodeFactory, ReplicaFactory, make_job

pytestmark = pytest.mark.django_db


class Play(FaultPlay):
    """FaultPlay with the one piece of Soak's state that firing a job fault reads."""

    def __init__(self, jobs):
        self.jobs = jobs


@pytest.fixture
def job():
    """A running wordcount whose stage count (operators split and count) has a primary on
    node-1; no standby."""
    job = make_job(status=Job.Status.RUNNING, name="soak-targets")
    Operator.objects.filter(job=job, name__in=("split", "count")).update(stage="count")
    ReplicaFactory(job=job, node=NodeFactory(name="node-1"), replica_id=f"{job.key}/count-1")
    return job


def standby_of(job, number: int, state=Replica.State.RUNNING):
    """A standby of stage count, `count-{number}` on `node-{number}`."""
    return ReplicaFactory(
        job=job,
        node=NodeFactory(name=f"node-{number}"),
        replica_id=f"{job.key}/count-{number}",
        role=Replica.Role.STANDBY,
        state=state,
    )


def fire(job, kind: str, number: int = 1):
    row = {"kind": kind, "target": "", "detail": ""}
    return row, Play([job]).fire_job_fault(row, event_rng(7, number))


def test_every_kind_the_soak_deals_has_an_entry():
    assert set(JOB_FAULTS + KAFKA_FAULTS) <= set(FAULT_KINDS)


@pytest.mark.parametrize("kind", ["kill-driver", "operator-exception"])
def test_a_primary_fault_hits_an_operator_of_a_stage_with_a_live_primary(job, kind):
    row, pending = fire(job, kind)
    fault = pending.fault
    assert (fault.kind, fault.target_node, pending.stage) == (kind, None, "count")
    assert fault.target_operator in ("split", "count")
    assert row["target"] == f"soak/{fault.target_operator}"


def test_a_standby_fault_needs_a_live_standby(job):
    row, pending = fire(job, "kill-standby")
    assert pending is None
    assert row["detail"] == "not injected: no target (no live replica it could hit)"
    standby_of(job, 2)
    _, pending = fire(job, "kill-standby")
    assert pending.fault.target_operator in ("split", "count")
    assert pending.stage == "count"


@pytest.mark.parametrize("kind", ["kill-node", "pause-node", "stress-node"])
def test_a_node_fault_hits_a_node_with_a_live_replica_of_the_job(job, kind):
    NodeFactory(name="node-3")  # up, but runs nothing of the job
    row, pending = fire(job, kind)
    fault = pending.fault
    assert (fault.kind, fault.target_node.name, fault.target_operator) == (kind, "node-1", "")
    assert row["target"] == "soak/node-1"


def test_the_kafka_broker_fault_needs_a_job_on_kafka(job):
    row, pending = fire(job, "kafka-broker")
    assert pending is None
    assert row["detail"] == "not injected: no target (no live replica it could hit)"


def test_a_killed_standby_counts_back_when_restarted_in_place_or_replaced(job):
    """A kill-standby's stage is protected again when its standby runs (caught up) after it was
    seen down: the killed replica restarted from its checkpoint keeps its row and start time,
    a replacement elsewhere has a new row started after the fault."""
    standby = standby_of(job, 2)
    _, pending = fire(job, "kill-standby")
    pending.fault.injected_at = timezone.now()
    play = Play([job])
    # Not yet seen down: the controller had not noticed the kill.
    assert play.standby_back_at(pending, 100.0) is None
    Replica.objects.filter(pk=standby.pk).update(state=Replica.State.STARTING)
    assert play.standby_back_at(pending, 101.0) is None
    Replica.objects.filter(pk=standby.pk).update(state=Replica.State.CATCHING_UP)
    assert play.standby_back_at(pending, 110.0) is None
    Replica.objects.filter(pk=standby.pk).update(state=Replica.State.RUNNING)
    assert play.standby_back_at(pending, 121.0) == 121.0

    # A replacement on another node, started after the fault, counts when it runs.
    _, pending = fire(job, "kill-standby", number=2)
    pending.fault.injected_at = timezone.now() - timedelta(seconds=5)
    Replica.objects.filter(pk=standby.pk).update(state=Replica.State.STOPPED)
    replacement = standby_of(job, 3)
    assert replacement.started_at > pending.fault.injected_at
    assert play.standby_back_at(pending, 130.0) == 130.0
