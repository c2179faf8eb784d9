"""The host reserve in the live controller: a launch that would cross it is refused (the API
says so in JSON), a standby is downgraded to checkpoint-only when the measured use of its host
crosses it and restored once room returns, not before the hold.

Real database, Redis and controller (launch_job, policy_cycle); the node agents are played at
their Redis edge (heartbeats naming one host, usage samples), the stages are not started.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from console.models import ControlDecision, Job
from console.policy.actions import AddStandby, DropStandby
from console.policy.config import PolicyConfig
from console.policy.placement import CycleInput, run_cycle
from console.policy.reserve import RESTORE_HOLD_S
from console.roles import OPERATOR
from console.services import controller
from console.services.control import cycle, observe, reserve
from console.services.policy import change_policy
from infra import keys as control_keys
from infra.queues import node_queue
from tests.factories import NodeFactory, make_job
from tests.policy.helpers import make_priority, make_sample

pytestmark = pytest.mark.django_db

NODES = ["rs-node-1", "rs-node-2", "rs-node-3"]
HOST = "boot:rs-test-host"
IDLE = dict.fromkeys(NODES, 0.0)
# The three agents' own processes on the one 2-core machine: 1.7 cores, 15% free < 20%.
BUSY = {"rs-node-1": 0.9, "rs-node-2": 0.5, "rs-node-3": 0.3}


@pytest.fixture(autouse=True)
def reserve_held():
    """The policy holds the reserve per host (off by default)."""
    change_policy({"hold_host_reserve": 1}, reason="hold the reserve per host")


@pytest.fixture(autouse=True)
def reserve_keys_cleared(redis_conn):
    node_keys = [k for n in NODES for k in (node_queue(n), control_keys.node_metrics(n))]
    redis_conn.delete(*node_keys, control_keys.reserve_claims())
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=8000.0)
    yield
    redis_conn.delete(
        *node_keys,
        *(control_keys.node_heartbeat(n) for n in NODES),
        control_keys.reserve_claims(),
    )


def publish_usage(client, cpu_used: dict[str, float], samples: int = 5) -> None:
    """What each node agent publishes every second (processes scope: its own processes' use),
    its heartbeat naming the machine it shares with the others."""
    for _ in range(samples):
        for name in NODES:
            usage = {"at": time.time(), "cpu_total": 2.0, "cpu_used": cpu_used[name],
                     "mem_total": 8000.0, "mem_used": 300.0, "disk_throughput": 0.0,
                     "disk_max_throughput": 200.0, "bw_used": 0.0, "bw_total": 1000.0,
                     "processes": 1, "spares": 0, "host": HOST}  # fmt: skip
            client.set(control_keys.node_heartbeat(name), json.dumps(usage), ex=30)
            client.xadd(control_keys.node_metrics(name), {"sample": json.dumps(usage)})


def decisions(job, kind) -> list[ControlDecision]:
    return list(job.decisions.filter(kind=kind).order_by("at", "pk"))


def test_a_standby_is_downgraded_when_its_host_crosses_the_reserve_and_restored_later(redis_conn):
    publish_usage(redis_conn, IDLE)
    job = make_job(status=Job.Status.CREATED, strategy=Job.Strategy.ADAPTIVE)
    plan = controller.launch_job(job)
    (stage,) = [s for s in plan.stages if s.standby_node]
    job.mark_running("test")
    supervisor = observe.load_supervisor(redis_conn, job)
    assert supervisor.has_standby(stage.name)
    (launched,) = decisions(job, ControlDecision.Kind.ADD_STANDBY)

    # The host's measured use crosses the reserve: the standby goes, saying why.
    publish_usage(redis_conn, BUSY)
    cycle.policy_cycle(job, supervisor, redis_conn)
    (drop,) = decisions(job, ControlDecision.Kind.DROP_STANDBY)
    assert drop.stage == stage.name and drop.node == stage.standby_node
    assert drop.reason.startswith(
        f"reserve: host {HOST}: cpu 15% / mem 89% free (measured) vs reserve 20%; the "
        "lowest-priority standby there"
    )
    assert not supervisor.has_standby(stage.name)
    claims = redis_conn.hgetall(control_keys.reserve_claims())
    claim = json.loads(claims[f"{job.key}:{stage.name}"])
    assert claim["downgraded_at"] is not None and claim["reason"] == drop.reason

    # Still busy, then idle but within the hold: no standby comes back, and no flapping.
    cycle.policy_cycle(job, supervisor, redis_conn)
    publish_usage(redis_conn, IDLE)
    cycle.policy_cycle(job, supervisor, redis_conn)
    assert decisions(job, ControlDecision.Kind.ADD_STANDBY) == [launched]
    assert len(decisions(job, ControlDecision.Kind.DROP_STANDBY)) == 1
    assert not supervisor.has_standby(stage.name)

    # The hold has passed (moved back in the published claim) and the host is idle: restored.
    claim["downgraded_at"] -= RESTORE_HOLD_S
    redis_conn.hset(control_keys.reserve_claims(), f"{job.key}:{stage.name}", json.dumps(claim))
    cycle.policy_cycle(job, supervisor, redis_conn)
    launched_again, restored = decisions(job, ControlDecision.Kind.ADD_STANDBY)
    assert launched_again == launched
    assert restored.stage == stage.name
    assert restored.reason.startswith(f"restored: room returned: host {HOST}: cpu ")
    assert supervisor.has_standby(stage.name)
    claim = json.loads(redis_conn.hget(control_keys.reserve_claims(), f"{job.key}:{stage.name}"))
    assert claim["downgraded_at"] is None


def test_a_launch_past_the_reserve_is_refused_by_the_api_and_by_the_launch(redis_conn, api_as):
    publish_usage(redis_conn, BUSY)
    body = {"name": "wc", "topology": "wordcount", "strategy": "adaptive", "params": {"rate": 5}}
    response = api_as(OPERATOR).post("/api/jobs/", body, format="json")
    assert response.status_code == 503
    error = response.json()["error"]
    assert (error["status"], error["code"]) == (503, "reserve")
    assert error["detail"].startswith(
        "launch refused: the reserve would not hold: its primaries (cpu "
    )
    assert f"would leave host {HOST}: cpu " in error["detail"]
    assert not Job.objects.filter(name="wc").exists()

    # A job created before the host filled up is refused by its launch, which says why.
    job = make_job(status=Job.Status.CREATED, strategy=Job.Strategy.ADAPTIVE)
    with pytest.raises(
        controller.LaunchError, match=f"refused: the reserve would not hold.*{HOST}"
    ):
        controller.launch_job(job)

    # With room the same request is accepted.
    publish_usage(redis_conn, IDLE)
    assert api_as(OPERATOR).post("/api/jobs/", body, format="json").status_code == 201


def test_the_machines_figures_come_from_the_heartbeats_that_carry_them():
    beats = {
        "n1": {"host": "boot:a", "host_cpu": 2.0, "host_mem_mb": 24576.0},
        "n2": {"host": "boot:a", "host_cpu": 2.0, "host_mem_mb": 24576.0},
        "sim": {"host": "rack-7"},  # a simulated host: its agent's own capacity
        "old": {"host": "boot:c", "host_cpu": "2", "host_mem_mb": None},  # not numbers
        "zero": {"host": "boot:d", "host_cpu": 0, "host_mem_mb": 1.0},
    }
    assert reserve.machines_of(beats) == {"boot:a": (2.0, 24576.0)}


def test_a_vetoed_stage_gets_no_standby_back_through_its_next_active_operator():
    # A stage of two active operators (as topn's window_count and topn in one stage): its
    # standby is the top one's, and the reserve vetoes the stage by that operator. Vetoing the
    # top one alone let Algorithm 2 add a standby back for the other in the same cycle that
    # dropped it, every cycle.
    priorities = [make_priority("window_count", 0.646), make_priority("topn", 0.639)]
    stages = {"window_count": ["window_count", "topn"]}
    veto = "reserve: host boot:a: cpu 12% / mem 83% free (measured) vs reserve 20%"
    vetoed = cycle.stage_vetoes({"window_count": veto}, stages, priorities)
    assert vetoed == {"window_count": veto, "topn": veto}
    samples = {n: [make_sample(n, 2.0, 0.2)] for n in ("n1", "n2", "n3")}
    state = CycleInput(
        priorities=priorities,
        primaries={"window_count": "n1", "topn": "n1"},
        standbys={"window_count": "n2"},
        samples=samples,
        alive=dict.fromkeys(samples, True),
        vetoed=vetoed,
    )
    actions = run_cycle(state, PolicyConfig()).actions
    assert DropStandby("window_count", "n2", veto) in actions
    assert not [a for a in actions if isinstance(a, AddStandby)]
    # Vetoed by its top operator only, as before: the standby came back at once.
    state = replace(state, vetoed={"window_count": veto})
    assert [type(a) for a in run_cycle(state, PolicyConfig()).actions if type(a) is AddStandby]
    # A stage not vetoed keeps nothing vetoed.
    assert cycle.stage_vetoes({}, stages, priorities) == {}
