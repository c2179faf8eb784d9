"""The node agent's side of pause-node and stress-node, against real processes and Redis:
it checks the bounds again, and resumes paused process groups from Python when due, also
after an agent restart."""

import json
import subprocess
import sys
import time

import psutil
import pytest
import redis
from django.conf import settings

from infra import keys
from infra.processes import CPU_HOG_MODULE, processes_matching
from spark_runtime.generators import generator_replica_id
from workers import agent
from workers.node import children, faults

NODE = "tn-pause"


@pytest.fixture(autouse=True)
def node_keys_cleared(redis_conn):
    redis_conn.delete(keys.paused_groups(NODE), keys.agent_events())
    yield
    redis_conn.delete(keys.paused_groups(NODE), keys.agent_events())


@pytest.fixture
def node_env(monkeypatch):
    monkeypatch.setenv("BACKSTOP_NODE", NODE)
    monkeypatch.setenv("BACKSTOP_NODE_CPU", "2")


@pytest.fixture
def groups():
    """Two process groups of `sleep` processes (a leader and a child each), like stages."""
    leaders = [
        subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
        for _ in range(2)
    ]
    time.sleep(0.3)
    yield leaders
    for leader in leaders:
        for proc in [*psutil.Process(leader.pid).children(), leader]:
            proc.kill()
        leader.wait()


@pytest.fixture
def fake_stage():
    """A process that looks like a stage of NODE to the agent, in a group of its own."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "spark_runtime.stage",
         "--node", NODE, "--job", "jk-pause"],
        start_new_session=True,
    )  # fmt: skip
    time.sleep(0.3)
    yield proc
    proc.kill()
    proc.wait()


def _states(leaders) -> set[str]:
    procs = [psutil.Process(p.pid) for p in leaders]
    procs += [c for p in procs for c in p.children()]
    return {p.status() for p in procs}


def _wait_for_states(leaders, wanted: set[str], timeout_s: float = 5.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while _states(leaders) != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    return _states(leaders)


def test_paused_groups_stop_and_resume_when_due(redis_conn, groups):
    pgids = [p.pid for p in groups]
    faults.pause_groups(redis_conn, NODE, pgids, duration_s=30)
    assert _wait_for_states(groups, {psutil.STATUS_STOPPED}) == {psutil.STATUS_STOPPED}
    deadline = json.loads(redis_conn.hget(keys.paused_groups(NODE), str(pgids[0])))["resume_at"]
    assert time.time() + 25 < deadline <= time.time() + 30
    assert faults.resume_due(redis_conn, NODE) == []  # not due yet: still stopped
    assert _states(groups) == {psutil.STATUS_STOPPED}
    assert sorted(faults.resume_due(redis_conn, NODE, now=deadline + 0.1)) == sorted(pgids)
    assert _wait_for_states(groups, {psutil.STATUS_SLEEPING}) == {psutil.STATUS_SLEEPING}
    assert redis_conn.hgetall(keys.paused_groups(NODE)) == {}


def test_a_restarted_agent_resumes_pauses_that_ended_while_it_was_down(redis_conn, groups):
    """Only Redis carries the deadline: a fresh connection (a new agent) finds and ends it."""
    faults.pause_groups(redis_conn, NODE, [p.pid for p in groups], duration_s=0.5)
    assert _wait_for_states(groups, {psutil.STATUS_STOPPED}) == {psutil.STATUS_STOPPED}
    time.sleep(0.6)
    restarted = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    assert len(faults.resume_due(restarted, NODE)) == 2
    assert _wait_for_states(groups, {psutil.STATUS_SLEEPING}) == {psutil.STATUS_SLEEPING}


def test_a_group_that_ended_meanwhile_is_forgotten(redis_conn):
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    faults.pause_groups(redis_conn, NODE, [gone.pid], duration_s=0.1)
    assert faults.resume_due(redis_conn, NODE, now=time.time() + 1) == [gone.pid]
    assert redis_conn.hgetall(keys.paused_groups(NODE)) == {}


def test_the_pause_node_task_stops_the_stage_group_until_due(redis_conn, node_env, fake_stage):
    groups = agent.pause_node(5, "jk-pause")
    assert groups == [fake_stage.pid]
    assert _wait_for_states([fake_stage], {psutil.STATUS_STOPPED}) == {psutil.STATUS_STOPPED}
    faults.resume_due(redis_conn, NODE, now=time.time() + 6)
    assert _wait_for_states([fake_stage], {psutil.STATUS_SLEEPING}) == {psutil.STATUS_SLEEPING}


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: agent.stress_node(10, 3), "params.workers: must be between 1 and 2"),
        (lambda: agent.stress_node(10, True), "params.workers: must be a whole number"),
        (lambda: agent.stress_node(10**6, 1), "params.duration_s: must be more than 0"),
        (lambda: agent.pause_node("lots"), "params.duration_s: must be a number of seconds"),
        (lambda: agent.pause_node(601), "params.duration_s: must be more than 0 and at most 600"),
    ],
)
def test_the_agent_refuses_out_of_bound_faults_and_reports_it(redis_conn, node_env, call, message):
    """The agent does not trust the controller: the same bounds, from its own capacity."""
    before = {p.pid for p in processes_matching(lambda argv: CPU_HOG_MODULE in argv)}
    with pytest.raises(faults.FaultRefusedByAgent, match=message):
        call()
    events = [fields for _, fields in redis_conn.xrange(keys.agent_events())]
    assert [(e["kind"], e["node"]) for e in events] == [("refused", NODE)]
    assert message in events[0]["detail"]
    after = {p.pid for p in processes_matching(lambda argv: CPU_HOG_MODULE in argv)}
    assert after <= before  # no hog was started
    assert redis_conn.hgetall(keys.paused_groups(NODE)) == {}


def test_the_agent_runs_hogs_within_its_bounds(node_env):
    pids = agent.stress_node(1, 2)
    assert len(pids) == 2
    for pid in pids:
        psutil.Process(pid).wait(timeout=10)


@pytest.mark.django_db
def test_a_fault_the_agent_refuses_is_marked_refused_not_injected(redis_conn, node_env):
    """The API's bounds passed, the agent's own (its cores, its maximum) did not."""
    from console.models import ControlDecision, FaultInjection
    from console.services.control.observe import read_agent_events
    from tests.factories import make_job

    job = make_job(status="running")
    fault = FaultInjection.objects.create(
        job=job, kind=FaultInjection.Kind.STRESS_NODE, outcome=FaultInjection.Outcome.INJECTED
    )
    with pytest.raises(faults.FaultRefusedByAgent):
        agent.stress_node(10, 3, fault_id=fault.pk, job_key=job.key)  # 3 hogs on 2 cores
    read_agent_events(redis_conn, job)
    fault.refresh_from_db()
    assert fault.outcome == FaultInjection.Outcome.REFUSED
    assert fault.outcome_detail.startswith("refused by the node agent: params.workers")
    assert fault.injected_at is None
    decision = ControlDecision.objects.get(job=job, kind=ControlDecision.Kind.FAULT)
    assert decision.reason.startswith("stress-node refused")
    read_agent_events(redis_conn, job)  # read again: nothing changes
    assert ControlDecision.objects.filter(job=job).count() == 1


def test_kill_node_kills_a_handed_replica_but_not_the_jobs_input_generator(node_env):
    """The generator stands for the source outside the job: a node kill leaves it running
    (docs/RESULTS.md runs kill-node with it), while a spare handed a replica that has not yet
    taken the replica's command line goes down with the node."""
    job = "jk-kill-node"
    procs = {
        rid: subprocess.Popen(["sleep", "60"], start_new_session=True)
        for rid in (generator_replica_id(job), "count-9")
    }
    with children._children_lock:
        for rid, proc in procs.items():
            children._children[(job, rid)] = (proc, job, None)
    try:
        killed = agent.kill_node(job)
        assert killed == [procs["count-9"].pid]
        assert procs["count-9"].wait(timeout=5) == -9
        assert procs[generator_replica_id(job)].poll() is None, "the generator runs on"
    finally:
        with children._children_lock:
            for rid in procs:
                children._children.pop((job, rid), None)
        for proc in procs.values():
            proc.kill()
            proc.wait()
