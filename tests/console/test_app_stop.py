"""Stopping an existing app's job through the controller's reconcile: its queries are asked
to stop first (a fenced stop command on the replica's command list), the job stays stopping
until the agent reports the process gone, and only then are its replicas killed and the job
marked stopped; one that does not stop in time is killed (real database and Redis; the node
agent and the stage played at their Redis edge; on real Spark: tests/integration/
test_app_live.py)."""

from __future__ import annotations

import json
import time

import pytest
from django.core.management import call_command

from console.models import ControlDecision, Job
from console.services import controller
from console.services.control import act, observe
from console.services.fleet import JobSlot, read_fleet_view
from infra import keys as control_keys
from infra.queues import node_queue
from spark_runtime import keys as data_keys
from spark_runtime import upgrade as upgrades
from spark_runtime.supervision import Supervisor, execute
from tests.agent_edge import task_args
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db

NODES = ["as-node-1", "as-node-2"]
NODE_QUEUES = [node_queue(n) for n in NODES]


@pytest.fixture
def running_app(redis_conn, jobs_dir):
    """A running job of the example app windows@1 (registered from jobs/apps/), its one
    replica job-1 seen running by its controller, the nodes' queues empty."""
    call_command("register_topology", app="apps/window_counts.py", name="windows")
    for name in NODES:
        NodeFactory(name=name)
    job = make_job(status=Job.Status.RUNNING, topology="windows@1", strategy="restart-all")
    sup = Supervisor(job.key, job.topology, {"job": ("app",)}, "restart-all", NODES, app=True)
    execute(sup.start(time.time()), act.AgentLauncher(job, redis_conn), lambda *a: None)
    beat = {"state": "running", "role": "primary", "batches": 3, "started_at": time.time()}
    redis_conn.set(data_keys.heartbeat(job.key, "job-1"), json.dumps(beat), ex=5)
    controller.supervise_tick(job, sup, redis_conn)
    observe.save_supervisor(redis_conn, job, sup)
    redis_conn.delete(*NODE_QUEUES)
    yield job, sup
    redis_conn.delete(*NODE_QUEUES)


def kills(client) -> list[str]:
    return [args[0] for args in task_args(client, NODE_QUEUES, "backstop.agent.kill_replica")]


def commands(client, job: Job) -> list[dict]:
    return [json.loads(c) for c in client.lrange(data_keys.control(job.key, "job-1"), 0, -1)]


def reconcile(client, job: Job, sup: Supervisor) -> bool:
    return controller.reconcile_job(
        job, sup, client, read_fleet_view(client), JobSlot(job=job, supervisor=sup)
    )


def test_a_stopping_app_stops_its_queries_before_its_process_is_killed(running_app, redis_conn):
    job, sup = running_app
    job.request_stop("by the operator")

    assert reconcile(redis_conn, job, sup) is True  # still stopping: waits for the app
    (asked,) = commands(redis_conn, job)
    assert asked["cmd"] == "stop" and asked["sent_at"] == sup.stop_asked_at
    assert kills(redis_conn) == []
    decision = job.decisions.get(kind=ControlDecision.Kind.STOP)
    assert decision.reason == "stop: job-1 asked to stop its queries"
    # The ask was saved with the state before it went out: a successor waits, not asks again.
    assert observe.load_supervisor(redis_conn, job).stop_asked_at == sup.stop_asked_at

    assert reconcile(redis_conn, job, sup) is True
    assert len(commands(redis_conn, job)) == 1
    job.refresh_from_db()
    assert job.status == Job.Status.STOPPING

    # The stage stopped its queries and exited; its agent reports the exit on its events
    # stream (workers.node.children._publish_exit).
    redis_conn.xadd(
        control_keys.agent_events(),
        {"kind": control_keys.EVENT_EXIT, "node": NODES[0], "job": job.key, "replica_id": "job-1",
         "returncode": "0", "log_tail": "", "at": str(time.time()), "since": ""},
    )  # fmt: skip
    assert reconcile(redis_conn, job, sup) is False
    job.refresh_from_db()
    assert (job.status, job.status_reason) == (Job.Status.STOPPED, "by the operator")
    assert "job-1" in kills(redis_conn)  # the kill is idempotent: nothing runs any more


def test_an_app_that_does_not_stop_in_time_is_killed(running_app, redis_conn):
    job, sup = running_app
    job.request_stop("by the operator")
    assert reconcile(redis_conn, job, sup) is True
    sup.stop_asked_at -= upgrades.APP_STOP_WITHIN_S  # asked that long ago; still running
    assert reconcile(redis_conn, job, sup) is False
    assert "job-1" in kills(redis_conn)
    job.refresh_from_db()
    assert job.status == Job.Status.STOPPED
    assert job.decisions.filter(kind=ControlDecision.Kind.STOP).latest("at").reason == (
        f"stop: job-1 still ran {upgrades.APP_STOP_WITHIN_S:g} s after it was asked to stop: killed"
    )
