"""The database load of supervising one job, counted: a fleet of hundreds of jobs multiplies it.

A reconcile between policy cycles reads nothing from the database (the job's status comes from
the fleet's one query a second); a policy cycle reads and writes a bounded number of times,
whatever the number of nodes, operators or replicas (no query per row)."""

from __future__ import annotations

import json
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.models import Job, Replica
from console.redis import redis_client
from console.services import controller
from console.services.control import observe
from console.services.fleet import JobSlot, read_fleet_view
from spark_runtime import keys as data_keys
from tests.agent_edge import publish_usage
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db

# At most this many queries per policy cycle of a settled job: with the default 5 s cycle, one
# query per job per second (docs/RESULTS.md, "Fleet scale", has the rate measured in a fleet).
CYCLE_QUERIES_MAX = 5


def stages_report(client, job: Job, supervisor) -> None:
    """What each live stage writes: its heartbeat and its entry in the job's replicas hash."""
    for replica in supervisor.live():
        beat = {"state": "running", "role": replica.role, "batches": 3, "started_at": time.time()}
        client.set(data_keys.heartbeat(job.key, replica.id), json.dumps(beat), ex=30)
        entry = {"state": "running", "role": replica.role, "epoch": 1, "pid": 4242,
                 "updated": time.time(), "stage": replica.spec.stage}  # fmt: skip
        client.hset(data_keys.replicas(job.key), replica.id, json.dumps(entry))


@pytest.mark.parametrize("node_count", [3, 12])
def test_a_settled_job_costs_no_query_per_tick_and_a_bounded_number_per_cycle(node_count):
    client = redis_client()
    nodes = [f"rq-node-{i}" for i in range(1, node_count + 1)]
    for name in nodes:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(client, nodes, ttl_s=60)
    job = make_job(status=Job.Status.CREATED, strategy=Job.Strategy.ADAPTIVE, params={"rate": 0})
    controller.launch_job(job)
    job.mark_running("every primary is running")
    supervisor = observe.load_supervisor(client, job)
    slot = JobSlot(job=job, supervisor=supervisor)
    view = read_fleet_view(client)
    counts = []
    for round_ in range(8):
        stages_report(client, job, supervisor)
        if round_ in (3, 7):
            slot.next_cycle = 0.0  # a policy cycle is due
        with CaptureQueriesContext(connection) as queries:
            assert controller.reconcile_job(job, supervisor, client, view, slot)
        counts.append(len(queries))
    ticks = [n for i, n in enumerate(counts) if i not in (0, 3, 7)]
    assert ticks == [0] * len(ticks), counts
    assert counts[7] <= CYCLE_QUERIES_MAX, counts
    # The replica rows were synced by the cycles (one bulk write, not one per replica).
    rows = Replica.objects.filter(job=job)
    assert rows.count() == len(supervisor.live())
    assert all(row.pid == 4242 and row.state == Replica.State.RUNNING for row in rows)
