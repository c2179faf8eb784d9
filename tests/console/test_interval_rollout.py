"""Checkpoint intervals reach the running stages: the controller starts a replica with its stage's
interval, then brings a changed interval to the standby first and the primary only once the
standby reports it in force, at a quiet moment, and records when each took effect.

Real database, Redis and controller; the stages are played at their Redis edge (the replicas
hash they write, the control list they read). The stage's side of the command, against a real
Spark query, is in tests/spark_runtime/test_topologies.py.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import time

import pytest

from console.models import ControlDecision, Job, Operator, Replica
from console.policy.checkpoint import state_store_confs
from console.services import controller
from console.services import policy as policy_service
from console.services.control import cycle, observe
from infra import keys as control_keys
from infra.queues import node_queue
from spark_runtime import keys as data_keys
from spark_runtime import topology as data_topology
from tests.factories import EpisodeFactory, NodeFactory, make_job

pytestmark = pytest.mark.django_db

NODES = ["ir-node-1", "ir-node-2", "ir-node-3"]


@pytest.fixture(autouse=True)
def node_keys_cleared(redis_conn):
    redis_conn.delete(*(node_queue(n) for n in NODES))
    yield
    redis_conn.delete(
        *(node_queue(n) for n in NODES), *(control_keys.node_heartbeat(n) for n in NODES)
    )


def nodes_alive(client):
    usage = {"at": time.time(), "cpu_total": 2.0, "cpu_used": 0.2, "mem_total": 4096.0,
             "mem_used": 1024.0, "disk_throughput": 1.0, "disk_max_throughput": 200.0,
             "bw_used": 1.0, "bw_total": 1000.0, "processes": 1, "spares": 0}  # fmt: skip
    for name in NODES:
        client.set(control_keys.node_heartbeat(name), json.dumps(usage), ex=30)
        client.xadd(control_keys.node_metrics(name), {"sample": json.dumps(usage)})


def report(client, job, supervisor, replica_id, seconds, since):
    """What a stage writes to the replicas hash: running, with its interval in force."""
    replica = next(r for r in supervisor.live() if r.id == replica_id)
    info = {"replica": replica_id, "stage": replica.spec.stage, "role": replica.role,
            "state": "running", "checkpoint_interval_s": seconds, "interval_since": since,
            "updated": time.time()}  # fmt: skip
    client.hset(data_keys.replicas(job.key), replica_id, json.dumps(info))


def commands(client, job, replica_id) -> list[dict]:
    key = data_keys.control(job.key, replica_id)
    found = [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    client.delete(key)
    return found


def launched(client, job):
    """job launched on NODES with a standby; (supervisor, stage, primary id, standby id)."""
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    nodes_alive(client)
    plan = controller.launch_job(job)
    (stage,) = plan.stages
    assert stage.standby_node is not None
    supervisor = observe.load_supervisor(client, job)
    for r in supervisor.live():
        supervisor.replicas[r.id].state = "running"
    primary = next(r.id for r in supervisor.live() if r.role == "primary")
    standby = next(r.id for r in supervisor.live() if r.role == "standby")
    return supervisor, stage.name, primary, standby


# Each topology is given a trigger other than its own here, to show that the replica gets its
# topology's.
@pytest.mark.parametrize("topology, trigger_s", [("wordcount", 0.5), ("topn", 2.0)])
def test_a_replica_starts_with_its_stages_interval_and_its_topology_s_trigger(
    redis_conn, monkeypatch, topology, trigger_s
):
    own = dataclasses.replace(data_topology.get_topology(topology), trigger_s=trigger_s)
    monkeypatch.setitem(data_topology.TOPOLOGIES, topology, own)
    job = make_job(topology=topology, strategy=Job.Strategy.ADAPTIVE)
    supervisor, stage, primary, _ = launched(redis_conn, job)
    interval = min(
        Operator.objects.filter(job=job, stage=stage).values_list(
            "checkpoint_interval_s", flat=True
        )
    )
    starts = [
        json.loads(base64.b64decode(message["body"]))[0][1]
        for name in NODES
        for message in map(json.loads, redis_conn.lrange(node_queue(name), 0, -1))
        if message["headers"]["task"] == "backstop.agent.start_replica"
    ]
    assert len(starts) == 2  # the primary and the standby
    for argv in starts:
        assert argv[argv.index("--checkpoint-interval") + 1] == str(interval)
        assert float(argv[argv.index("--trigger-seconds") + 1]) == trigger_s
        confs = dict(
            argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--spark-conf"
        )
        assert confs == state_store_confs(interval, trigger_s)


def test_a_new_interval_goes_to_the_standby_then_the_primary_and_is_recorded(redis_conn):
    policy_service.change_policy({"interval_apply_gap_s": 10.0}, reason="rollout test")
    job = make_job(status=Job.Status.CREATED, strategy=Job.Strategy.ADAPTIVE)
    supervisor, stage, primary, standby = launched(redis_conn, job)
    job.mark_running("test")
    long_ago = time.time() - 60
    for rid in (primary, standby):
        report(redis_conn, job, supervisor, rid, 60.0, long_ago)
    Operator.objects.filter(job=job, stage=stage).update(checkpoint_interval_s=8.0)
    config = policy_service.policy_in_force().to_config()

    # A recovery under way: not a quiet moment, nothing is sent.
    episode = EpisodeFactory(job=job, stage=stage)
    assert cycle.roll_out_intervals(job, supervisor, redis_conn, config) == []
    episode.delete()

    (first,) = cycle.roll_out_intervals(job, supervisor, redis_conn, config)
    assert first.replica_id == standby
    assert commands(redis_conn, job, standby) == [
        {
            "cmd": "checkpoint_interval",
            "seconds": 8.0,
            "confs": state_store_confs(8.0, data_topology.get_topology(job.topology).trigger_s),
        }
    ]
    assert commands(redis_conn, job, primary) == []
    # Until the standby reports it, the primary waits (and the request is not repeated).
    assert cycle.roll_out_intervals(job, supervisor, redis_conn, config) == []

    took_effect = time.time()
    report(redis_conn, job, supervisor, standby, 8.0, took_effect)
    (second,) = cycle.roll_out_intervals(job, supervisor, redis_conn, config)
    assert second.replica_id == primary
    assert [c["seconds"] for c in commands(redis_conn, job, primary)] == [8.0]
    in_effect = job.decisions.filter(
        kind=ControlDecision.Kind.SET_INTERVAL, reason__contains="in effect since"
    )
    assert [d.replica_id for d in in_effect] == [standby]

    report(redis_conn, job, supervisor, primary, 8.0, time.time())
    assert cycle.roll_out_intervals(job, supervisor, redis_conn, config) == []
    assert {d.replica_id for d in in_effect.all()} == {standby, primary}  # each recorded once
    assert in_effect.all().count() == 2
    observe.sync_replicas(job, redis_conn, supervisor)
    row = Replica.objects.get(replica_id=f"{job.key}/{standby}")
    assert row.checkpoint_interval_s == 8.0
    assert abs(row.interval_since.timestamp() - took_effect) < 0.01
    # Its CPU priority and batch pace come along, as the stage reports them.
    entry = json.loads(redis_conn.hget(data_keys.replicas(job.key), standby))
    entry.update(nice=5, batch_every_s=3.0)
    redis_conn.hset(data_keys.replicas(job.key), standby, json.dumps(entry))
    observe.sync_replicas(job, redis_conn, supervisor)
    row.refresh_from_db()
    assert (row.nice, row.batch_every_s) == (5, 3.0)
