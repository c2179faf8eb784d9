"""Every fault kind from request to send: the target each kind takes, the detail text it is
recorded with, and exactly what is sent (the Celery task on the target node's queue, or the
command on the replica's control list, with its lease field), read back from the real Redis
broker. The kafka-broker outage is followed through in tests/console/test_kafka_broker_fault.py.
"""

from __future__ import annotations

import base64
import json

import pytest

from console.models import FaultInjection, Job, Operator, Replica
from console.services import faults
from console.services.control.fence import acting_under
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import LEASE_FIELD
from tests.factories import FaultFactory, NodeFactory, ReplicaFactory, make_job

pytestmark = pytest.mark.django_db

NODE = "node-7"
QUEUE = f"node.{NODE}"  # Celery's list of the node agent's queue in the broker
TOKEN = "lease-token-1"

# What each kind names as its target, written out here rather than read from the product.
TARGETS = {
    "kill-driver": "operator",
    "kill-standby": "operator",
    "operator-exception": "operator",
    "slow-driver": "operator",
    "kill-executor": "operator",
    "kill-worker": "operator",
    "kill-node": "node",
    "pause-node": "node",
    "stress-node": "node",
    "kafka-broker": None,
}


@pytest.fixture
def job():
    job = make_job(status=Job.Status.RUNNING, name="kinds")
    Operator.objects.filter(job=job, name__in=("split", "count")).update(stage="count")
    return job


@pytest.fixture
def node():
    return NodeFactory(name=NODE)


@pytest.fixture(autouse=True)
def queue_cleared(redis_conn, job):
    redis_conn.delete(QUEUE, data_keys.replicas(job.key))
    yield
    redis_conn.delete(QUEUE, data_keys.replicas(job.key))
    for local_id in ("count-p", "count-s"):
        redis_conn.delete(data_keys.control(job.key, local_id))


def replicas(job, node):
    """A running primary and standby of stage count (operators split and count)."""
    primary = ReplicaFactory(job=job, node=node, replica_id=f"{job.key}/count-p", pid=4101)
    standby = ReplicaFactory(
        job=job, node=node, replica_id=f"{job.key}/count-s", pid=4102, role=Replica.Role.STANDBY
    )
    return primary, standby


def sent_tasks(client) -> list[tuple[str, list, dict]]:
    """(task name, args, kwargs) of each message on the node agent's queue, oldest first."""
    found = []
    for raw in reversed(client.lrange(QUEUE, 0, -1)):  # Celery pushes on the left
        message = json.loads(raw)
        args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], args, kwargs))
    return found


def inject(job, kind, **fields) -> FaultInjection:
    with acting_under(TOKEN):
        return faults.inject(FaultFactory(job=job, kind=kind, **fields))


def test_every_kind_has_an_entry_in_the_table():
    """A new FaultInjection.Kind without an entry (its target and how it is carried out)
    fails here."""
    assert set(faults.FAULT_KINDS) == set(FaultInjection.Kind.values)
    assert {kind: faults.FAULT_KINDS[kind].target for kind in TARGETS} == TARGETS


def test_the_kinds_test_below_covers_every_kind():
    assert set(TARGETS) == set(FaultInjection.Kind.values)


@pytest.mark.parametrize("kind, role", [("kill-driver", "primary"), ("kill-standby", "standby")])
def test_a_kill_of_a_replica_goes_to_its_nodes_agent(job, node, redis_conn, kind, role):
    primary, standby = replicas(job, node)
    hit = primary if role == "primary" else standby
    fault = inject(job, kind, target_operator="split")
    assert fault.outcome == FaultInjection.Outcome.INJECTED
    assert fault.outcome_detail == f"SIGKILL to {hit.local_id} (pid {hit.pid}) on {NODE}"
    assert sent_tasks(redis_conn) == [
        ("backstop.agent.kill_replica", [hit.local_id], {"job_key": job.key})
    ]


def test_an_operator_exception_is_armed_through_the_primarys_control_list(job, node, redis_conn):
    replicas(job, node)
    fault = inject(job, "operator-exception", target_operator="count")
    assert fault.outcome_detail == "armed an exception in the next batch of count-p"
    (sent,) = redis_conn.lrange(data_keys.control(job.key, "count-p"), 0, -1)
    assert json.loads(sent) == {
        "cmd": "fault", "kind": "operator_exception", "after_batches": 1, LEASE_FIELD: TOKEN,
    }  # fmt: skip
    assert redis_conn.llen(data_keys.control(job.key, "count-s")) == 0


def test_a_slow_driver_takes_its_defaults(job, node, redis_conn):
    replicas(job, node)
    fault = inject(job, "slow-driver", target_operator="count")
    assert fault.outcome_detail == "each batch of count-p 2 s longer for 10 s"
    (sent,) = redis_conn.lrange(data_keys.control(job.key, "count-p"), 0, -1)
    assert json.loads(sent) == {
        "cmd": "fault", "kind": "slow_batches", "delay_s": 2.0, "duration_s": 10.0,
        LEASE_FIELD: TOKEN,
    }  # fmt: skip


@pytest.mark.parametrize(
    "kind, process", [("kill-executor", "executor"), ("kill-worker", "worker")]
)
def test_a_spark_kill_goes_to_the_primarys_agent(job, node, redis_conn, kind, process):
    replicas(job, node)
    redis_conn.hset(data_keys.replicas(job.key), "count-p", json.dumps({"spark_app": "app-42"}))
    fault = inject(job, kind, target_operator="count")
    assert fault.outcome_detail == (
        f"SIGKILL to a Spark {process} of application app-42 (asked {NODE})"
    )
    assert sent_tasks(redis_conn) == [
        (
            "backstop.agent.kill_spark_process",
            ["app-42", kind],
            {"fault_id": fault.pk, "job_key": job.key},
        )
    ]


def test_a_kill_node_goes_to_the_nodes_agent(job, node, redis_conn):
    fault = inject(job, "kill-node", target_operator="", target_node=node)
    assert fault.outcome_detail == f"SIGKILL to every replica of the job on {NODE}"
    assert sent_tasks(redis_conn) == [("backstop.agent.kill_node", [job.key], {})]


def test_a_pause_node_carries_its_duration(job, node, redis_conn):
    fault = inject(
        job, "pause-node", target_operator="", target_node=node, params={"duration_s": 3.5}
    )
    assert fault.outcome_detail == f"SIGSTOP for 3.5 s on {NODE}"
    assert sent_tasks(redis_conn) == [
        ("backstop.agent.pause_node", [3.5, job.key], {"fault_id": fault.pk})
    ]


def test_a_stress_node_carries_its_duration_and_workers(job, node, redis_conn):
    fault = inject(
        job,
        "stress-node",
        target_operator="",
        target_node=node,
        params={"duration_s": 12, "workers": 2},
    )
    assert fault.outcome_detail == f"2 CPU hogs for 12 s on {NODE}"
    assert sent_tasks(redis_conn) == [
        ("backstop.agent.stress_node", [12.0, 2], {"fault_id": fault.pk, "job_key": job.key})
    ]


@pytest.mark.parametrize(
    "kind, reason",
    [
        ("kill-driver", "no running primary for operator 'count'"),
        ("kill-standby", "no running standby for operator 'count'"),
        ("operator-exception", "no running primary for operator 'count'"),
        ("slow-driver", "no running primary for operator 'count'"),
        (
            "kill-executor",
            "operator 'count' has no primary running on a Spark cluster (application unknown): "
            "kill-executor needs SPARK_MASTER=spark://...",
        ),
        ("kafka-broker", "the job uses no Kafka"),
    ],
)
def test_a_fault_with_nothing_to_hit_fails_with_the_reason(job, redis_conn, kind, reason):
    target = "" if kind == "kafka-broker" else "count"
    fault = inject(job, kind, target_operator=target)
    assert (fault.outcome, fault.outcome_detail, fault.injected_at) == ("failed", reason, None)
    assert redis_conn.llen(QUEUE) == 0


def test_a_fault_no_longer_pending_is_left_as_it_is(job, node, redis_conn):
    replicas(job, node)
    fault = inject(job, "kill-node", target_operator="", target_node=node)
    assert faults.inject(fault) == fault
    assert len(sent_tasks(redis_conn)) == 1


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_request_fault_checks_the_target_each_kind_takes(job, node, kind):
    """A kind refuses the targets it does not take, with the field and the same words."""
    target = TARGETS[kind]
    if target is None:
        with pytest.raises(faults.FaultRefused) as refused:
            faults.request_fault(job, kind, target_node=node)
        assert (refused.value.field, str(refused.value)) == (
            "target_node",
            f"target_node: {kind} takes no target (it acts on the job's Kafka broker)",
        )
        return
    if target == "node":
        with pytest.raises(faults.FaultRefused) as refused:
            faults.request_fault(job, kind, target_operator="count")
        assert str(refused.value) == f"target_node: {kind} needs a node"
        fault = faults.request_fault(job, kind, target_node=node)
        assert (fault.target_node, fault.target_operator) == (node, "")
        return
    with pytest.raises(faults.FaultRefused) as refused:
        faults.request_fault(job, kind, target_node=node)
    assert str(refused.value) == f"target_operator: {kind} needs an operator"
    with pytest.raises(faults.FaultRefused) as refused:
        faults.request_fault(job, kind, target_operator="nope")
    assert str(refused.value) == "target_operator: job 'kinds' has no operator 'nope'"
    assert faults.request_fault(job, kind, target_operator="count").target_operator == "count"


def test_a_stored_kind_without_an_entry_fails_with_the_reason(job, redis_conn):
    """A row of a kind this code does not know (written by a newer version) is not sent."""
    fault = inject(job, "melt-disk", target_operator="count")
    assert (fault.outcome, fault.outcome_detail) == ("failed", "unknown fault kind 'melt-disk'")
    assert redis_conn.llen(QUEUE) == 0
