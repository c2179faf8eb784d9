"""Standby placement in the live controller: the launch stores why the standby went where it did,
every policy cycle stores why it stays or moves, and a standby on a clearly worse node is moved
once it has settled, exactly once.

Real database, Redis and controller; the node agents are played at their Redis edge (heartbeat
and usage samples), the stages are not started.
"""

from __future__ import annotations

import json
import time

import pytest

from console.models import ControlDecision, Job, Replica
from console.policy.placement import MOVE_SETTLE_S
from console.services import controller
from console.services.control import cycle, observe
from console.services.control.act import AgentLauncher
from console.services.control.commands import command_sender
from infra import keys as control_keys
from infra.queues import node_queue
from spark_runtime.replicas import RUNNING, HeartbeatSeen
from spark_runtime.supervision import execute
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db

NODES = ["sp-node-1", "sp-node-2", "sp-node-3"]


@pytest.fixture(autouse=True)
def node_keys_cleared(redis_conn):
    node_keys = [k for n in NODES for k in (node_queue(n), control_keys.node_metrics(n))]
    redis_conn.delete(*node_keys)
    yield
    redis_conn.delete(*node_keys, *(control_keys.node_heartbeat(n) for n in NODES))


def publish_usage(client, cpu_used: dict[str, float] | None = None, samples: int = 5) -> None:
    """What each node agent publishes every second: a heartbeat and a usage sample."""
    for _ in range(samples):
        for name in NODES:
            cpu = (cpu_used or {}).get(name, 0.0)
            usage = {"at": time.time(), "cpu_total": 2.0, "cpu_used": cpu, "mem_total": 4096.0,
                     "mem_used": 1500.0 * cpu, "disk_throughput": 0.0,
                     "disk_max_throughput": 200.0, "bw_used": 0.0, "bw_total": 1000.0,
                     "processes": 1, "spares": 0}  # fmt: skip
            client.set(control_keys.node_heartbeat(name), json.dumps(usage), ex=30)
            client.xadd(control_keys.node_metrics(name), {"sample": json.dumps(usage)})


def live_standby(job) -> Replica:
    return Replica.objects.exclude(state=Replica.State.STOPPED).get(
        job=job, role=Replica.Role.STANDBY
    )


def test_the_launch_and_each_cycle_record_why_the_standby_sits_where_it_is(redis_conn):
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(redis_conn)  # three idle nodes: Q ties
    job = make_job(status=Job.Status.CREATED, strategy=Job.Strategy.ADAPTIVE)
    plan = controller.launch_job(job)
    (stage,) = plan.stages
    # The primary takes sp-node-1 (tie, by name); the standby may not share it, and sp-node-2
    # and sp-node-3 tie again.
    assert (stage.primary_node, stage.standby_node) == ("sp-node-1", "sp-node-2")
    standby = live_standby(job)
    assert standby.node.name == "sp-node-2"
    assert standby.placement["rule"] == "placed at launch"
    assert standby.placement["reason"].endswith("a tie, broken by name)")
    assert standby.placement["reserve"].startswith("kept after the launch plan")
    job.mark_running("test")
    supervisor = observe.load_supervisor(redis_conn, job)

    # A cycle right after the launch: the new standby settles first.
    cycle.policy_cycle(job, supervisor, redis_conn)
    standby.refresh_from_db()
    assert standby.placement["rule"] == "kept"
    assert standby.placement["reason"].startswith("kept: started 0 s ago")

    # Its node turns busy (cpu 1.6 of 2) while sp-node-3 stays idle; once the standby has run
    # MOVE_SETTLE_S there, the next cycle moves it to sp-node-3.
    publish_usage(redis_conn, {"sp-node-2": 1.6})
    for replica in supervisor.live():
        replica.launched_at -= MOVE_SETTLE_S + 1
        replica.state = RUNNING  # only a running standby is judged for a move
    cycle.policy_cycle(job, supervisor, redis_conn)
    (move,) = job.decisions.filter(kind=ControlDecision.Kind.MOVE_STANDBY)
    assert move.node == "sp-node-3"
    assert "on sp-node-3 with this standby vs" in move.reason
    assert "more than the move margin 0.47 higher" in move.reason
    moved = Replica.objects.get(job=job, role=Replica.Role.STANDBY, node__name="sp-node-3")
    assert moved.placement["rule"] == "moved"
    assert moved.placement["reason"] == f"moved from sp-node-2: {move.reason}"
    # Make before break: the old standby protects the stage until the moved one is caught up;
    # a cycle meanwhile decides no second move.
    assert Replica.objects.get(pk=standby.pk).state != Replica.State.STOPPED
    cycle.policy_cycle(job, supervisor, redis_conn)
    assert job.decisions.filter(kind=ControlDecision.Kind.MOVE_STANDBY).count() == 1
    caught_up = HeartbeatSeen(moved.local_id, time.time(), {"state": "running", "role": "standby"})
    execute(
        supervisor.handle(caught_up),
        AgentLauncher(job, redis_conn),
        command_sender(redis_conn, job),
    )
    assert Replica.objects.get(pk=standby.pk).state == Replica.State.STOPPED
    assert live_standby(job) == moved

    # The next cycles leave it there: it settles, and no second move is decided.
    publish_usage(redis_conn, {"sp-node-3": 0.3})
    for _ in range(2):
        cycle.policy_cycle(job, supervisor, redis_conn)
    assert job.decisions.filter(kind=ControlDecision.Kind.MOVE_STANDBY).count() == 1
    moved.refresh_from_db()
    assert moved.placement["rule"] == "kept"
    assert moved.placement["node"] == "sp-node-3"


def test_once_a_stage_runs_its_operators_are_scored_from_what_its_process_uses(redis_conn):
    """The agent publishes the primary's process tree: 1.22 cores (averaged) and 1368 MiB. Less
    an idle stage process (0.02 cores, 600 MiB), that is 1.2 cores and 768 MiB for the chained
    stage `count` (split + count), split as their estimates (0.3:0.5 cores, 256:512 MiB)."""
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(redis_conn)
    job = make_job(status=Job.Status.CREATED, strategy=Job.Strategy.ADAPTIVE)
    controller.launch_job(job)
    job.mark_running("test")
    supervisor = observe.load_supervisor(redis_conn, job)
    cycle.policy_cycle(job, supervisor, redis_conn)  # not running yet: the estimates
    count = job.operators.get(name="count")
    assert (count.cpu_demand, count.mem_demand_mb, count.demand_source) == (0.5, 512, "estimated")

    (primary,) = [r for r in supervisor.live() if r.spec.role == "primary"]
    primary.state = RUNNING
    entry = {"cpu": 1.5, "cpu_avg": 1.22, "rss_mb": 1368.0, "busy": True, "at": time.time()}
    redis_conn.hset(
        control_keys.replica_activity(job.key), primary.spec.replica_id, json.dumps(entry)
    )
    try:
        cycle.policy_cycle(job, supervisor, redis_conn)
    finally:
        redis_conn.delete(control_keys.replica_activity(job.key))
    demands = {
        op.name: (op.cpu_demand, op.mem_demand_mb, op.demand_source)
        for op in job.operators.filter(name__in=["split", "count"])
    }
    assert demands == {
        "split": (pytest.approx(0.45), pytest.approx(256.0), "measured"),
        "count": (pytest.approx(0.75), pytest.approx(512.0), "measured"),
    }
    # R = 0.5 * 0.75 / 6 cores + 0.5 * 512 / 12288 MiB (three nodes of 2 cores and 4096 MiB).
    count.refresh_from_db()
    assert count.resource_score == pytest.approx(0.5 * 0.75 / 6 + 0.5 * 512 / 12288)
