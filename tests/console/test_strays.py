"""Stray replicas (console/policy/strays.py): a process that still beats after its kill was lost
is killed again by the controller's cycle, fenced; an entry left by a process already gone,
or a replica the supervisor lists, is never."""

from __future__ import annotations

import json
import time

import pytest

from console.models import ControlDecision, Job
from console.policy.strays import confirmed_strays, stray_candidates
from console.services import controller
from console.services.control import act, observe
from console.services.control.fence import acting_under
from infra import keys as control_keys
from infra import tasks
from spark_runtime import keys as data_keys
from tests.agent_edge import publish_usage
from tests.factories import NodeFactory, make_job

TOKEN = "controller-a#3"


def test_a_beating_replica_the_state_does_not_list_is_a_candidate():
    reported = {"count-1": {"node": "n1"}, "count-9": {"node": "n2"}, "split-4": {"node": "n1"}}
    alive = {"count-1": True, "count-9": True, "split-4": False}
    assert stray_candidates(reported, alive, {"count-1", "split-1"}) == {"count-9": {"node": "n2"}}


def test_a_candidate_is_confirmed_when_its_heartbeat_moved_on_since_the_cycle_before():
    before = {"a": 100.0, "b": 100.0}
    assert confirmed_strays({"a": 105.0, "b": 100.0, "c": 105.0}, before) == ["a"]
    assert confirmed_strays({"a": 105.0}, {}) == []


def beat(client, job: Job, replica_id: str, node: str, updated: float) -> None:
    """What a running stage writes every heartbeat: its entry and its heartbeat key."""
    entry = {"replica": replica_id, "stage": replica_id.split("-")[0], "role": "standby",
             "state": "running", "node": node, "pid": 4242, "updated": updated}  # fmt: skip
    client.hset(data_keys.replicas(job.key), replica_id, json.dumps(entry))
    client.set(data_keys.heartbeat(job.key, replica_id), json.dumps(entry), ex=30)


@pytest.mark.django_db
def test_the_cycle_kills_a_stray_once_it_beats_on_and_leaves_the_rest(redis_conn, monkeypatch):
    nodes = ["stray-node-1", "stray-node-2", "stray-node-3"]
    for name in nodes:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(redis_conn, nodes, ttl_s=60)
    job = make_job(status=Job.Status.CREATED, params={"rate": 0})
    controller.launch_job(job)
    supervisor = observe.load_supervisor(redis_conn, job)
    sent = []
    monkeypatch.setattr(tasks, "send", lambda task, *args, **kw: sent.append((task, args, kw)))
    try:
        now = time.time()
        for replica in supervisor.live():  # the replicas it lists beat too
            beat(redis_conn, job, replica.id, replica.spec.node, now)
        beat(redis_conn, job, "count-9", "stray-node-2", now)  # its kill was lost
        beat(redis_conn, job, "count-8", "stray-node-3", now)  # killed: its key outlives it

        with acting_under(TOKEN):
            strays = observe.sync_replicas(job, redis_conn, supervisor)
            assert sorted(strays) == ["count-8", "count-9"]
            assert act.kill_strays(job, redis_conn, strays) == []  # one sighting: not yet
            beat(redis_conn, job, "count-9", "stray-node-2", now + 5)  # still running
            strays = observe.sync_replicas(job, redis_conn, supervisor)
            assert act.kill_strays(job, redis_conn, strays) == ["count-9"]

        (kill,) = [(args, kw) for task, args, kw in sent if task is tasks.KILL_REPLICA]
        args, kw = kill
        assert args == ("count-9",)
        assert kw["queue"].endswith("stray-node-2") and kw["lease"] == TOKEN  # fenced
        decision = ControlDecision.objects.get(job=job, kind=ControlDecision.Kind.KILL_STRAY)
        assert "count-9 on stray-node-2" in decision.reason
        # Gone for good: its heartbeat key expired; nothing is a candidate any more.
        redis_conn.delete(data_keys.heartbeat(job.key, "count-9"))
        redis_conn.delete(data_keys.heartbeat(job.key, "count-8"))
        with acting_under(TOKEN):
            assert observe.sync_replicas(job, redis_conn, supervisor) == {}
            assert act.kill_strays(job, redis_conn, {}) == []
        assert not redis_conn.exists(control_keys.job_strays(job.key))
    finally:
        data_keys.delete_job_keys(redis_conn, job.key)
        redis_conn.delete(*control_keys.controller_job_keys(job.key))
