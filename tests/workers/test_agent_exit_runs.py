"""The exit of a replica's earlier run, reported after the replica was started again, does not
end the new run. A stage whose query failed writes its cause and takes seconds to exit; the
supervisor restarts the replica as soon as it sees the failure. The old process's exit then
reached the job's exits hash after the restart had cleared it, and the new process, still
starting, was taken for dead: a second failure and a second restart (seen in CI as two failure
decisions for one replica after one operator exception).

Real processes started and reaped by the node agent's own code, a real Redis and database; the
times compared are taken here, around the agent's calls."""

import os
import signal
import time

import pytest

from console.services.control.act import AgentLauncher
from console.services.control.observe import read_agent_events
from infra import keys
from spark_runtime.replicas import CLOCK_SLACK_S
from tests.factories import make_job
from tests.workers.agent_children import kill_children_of
from workers import agent
from workers.node import children

NODE = "tn-runs"
REPLICA = "count-1"
FAKE_STAGE = "tests.workers.sleeping_stage"

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    return make_job(status="running")


@pytest.fixture(autouse=True)
def job_events_cleared(redis_conn, job):
    yield
    ours = [i for i, e in redis_conn.xrange(keys.agent_events()) if e.get("job") == job.key]
    if ours:
        redis_conn.xdel(keys.agent_events(), *ours)
    redis_conn.delete(
        keys.exits(job.key), keys.exit_tails(job.key), keys.agent_events_cursor(job.key)
    )


@pytest.fixture
def stage_agent(monkeypatch, tmp_path, settings, job):
    """The agent of NODE, allowed to start the sleeping stand-in instead of a Spark stage."""
    monkeypatch.setenv("BACKSTOP_NODE", NODE)
    monkeypatch.setattr(children, "ALLOWED_ENTRY_POINTS", {FAKE_STAGE: None})
    settings.VAR_DIR = tmp_path
    yield agent
    kill_children_of({job.key})


def start_and_kill(job_key: str) -> tuple[float, float]:
    """Start REPLICA through the agent, SIGKILL it and let the agent publish its exit; returns
    (just before, just after) the start."""
    before = time.time()
    pid = agent.start_replica(
        FAKE_STAGE,
        ["--job", job_key, "--stage", "count", "--role", "primary", "--replica-id", REPLICA,
         "--node", NODE],
        REPLICA,
        job_key,
    )  # fmt: skip
    after = time.time()
    os.killpg(pid, signal.SIGKILL)
    deadline = time.time() + 10
    while children.running_replica(REPLICA, job_key) is not None and time.time() < deadline:
        time.sleep(0.05)
    return before, after


def exit_events(client, job_key: str) -> list[dict]:
    return [
        e
        for _, e in client.xrange(keys.agent_events())
        if e.get("job") == job_key and e["kind"] == keys.EVENT_EXIT
    ]


def test_an_exit_of_the_replicas_earlier_run_does_not_end_the_run_asked_for(
    stage_agent, redis_conn, job
):
    first_before, first_after = start_and_kill(job.key)
    time.sleep(CLOCK_SLACK_S + 0.2)
    relaunched_at = time.time()  # the supervisor asks for the replica again
    launcher = AgentLauncher(job, redis_conn)
    launcher.client.hdel(keys.exits(job.key), REPLICA)  # what AgentLauncher.start clears
    children.report_exits(redis_conn, NODE)  # the first run's exit, published after the relaunch

    [first_exit] = exit_events(redis_conn, job.key)
    assert first_before <= float(first_exit["since"]) <= first_after
    read_agent_events(redis_conn, job, {REPLICA: relaunched_at})
    assert launcher.alive(REPLICA), "the earlier run's exit was taken for the new run's"

    # The run asked for ends: its exit is the replica's.
    second_before, second_after = start_and_kill(job.key)
    children.report_exits(redis_conn, NODE)
    second_exit = exit_events(redis_conn, job.key)[-1]
    assert second_before <= float(second_exit["since"]) <= second_after
    read_agent_events(redis_conn, job, {REPLICA: relaunched_at})
    assert not launcher.alive(REPLICA)
    assert launcher.exit_code(REPLICA) == -signal.SIGKILL


def test_an_exit_without_its_start_time_still_counts(stage_agent, redis_conn, job):
    """An agent of an earlier version reports no `since`: its exits count as before."""
    redis_conn.xadd(
        keys.agent_events(),
        {"kind": keys.EVENT_EXIT, "node": NODE, "job": job.key, "replica_id": REPLICA,
         "returncode": "1", "log_tail": "", "at": str(time.time())},
    )  # fmt: skip
    read_agent_events(redis_conn, job, {REPLICA: time.time()})
    assert not AgentLauncher(job, redis_conn).alive(REPLICA)


def test_a_start_right_after_a_kill_starts_a_new_process(stage_agent, redis_conn, job):
    """A restart of a live replica is a kill, then a start, of the same replica id on its node.
    The start must not find the process being killed and take it for the replica: it then
    never reported, and the restart waited for the supervisor's start-up grace (90 s, seen in
    a stop-and-restart upgrade of the benchmark). The kill returns once the process is gone."""
    argv = ["--job", job.key, "--stage", "count", "--role", "primary", "--replica-id", REPLICA,
            "--node", NODE, "--hold-mb", "1500"]  # fmt: skip
    pid = agent.start_replica(FAKE_STAGE, argv, REPLICA, job.key)
    for _ in range(3):
        time.sleep(2)  # its memory filled
        assert agent.kill_replica(REPLICA, "SIGKILL", job.key)
        assert children.running_replica(REPLICA, job.key) is None
        restarted = agent.start_replica(FAKE_STAGE, argv, REPLICA, job.key)
        assert restarted != pid
        pid = restarted


def test_a_start_that_finds_the_killed_process_still_dying_starts_anew(
    stage_agent, redis_conn, job, monkeypatch
):
    """The start also knows which process the kill was for: found while it dies (its command
    line already unreadable, or the agent's own child not yet reaped), it is waited for and a
    new one started, even when the kill returned without waiting for it."""
    argv = ["--job", job.key, "--stage", "count", "--role", "primary", "--replica-id", REPLICA,
            "--node", NODE, "--hold-mb", "1500"]  # fmt: skip
    pid = agent.start_replica(FAKE_STAGE, argv, REPLICA, job.key)
    time.sleep(2)  # its memory filled
    real_wait_gone = children.wait_gone
    monkeypatch.setattr(children, "wait_gone", lambda proc, timeout_s: True)
    assert agent.kill_replica(REPLICA, "SIGKILL", job.key)
    monkeypatch.setattr(children, "wait_gone", real_wait_gone)
    restarted = agent.start_replica(FAKE_STAGE, argv, REPLICA, job.key)
    assert restarted != pid
    assert children.running_replica(REPLICA, job.key).pid == restarted
