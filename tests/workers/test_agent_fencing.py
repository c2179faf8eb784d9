"""A node agent carries out a controller's start or kill only while the controller still holds
the job's lease (spark_runtime/command_fence.py): the tasks run with real processes (the sleeping
stand-in stage) against the real Redis, and the outcome is read from the process table."""

import time

import psutil
import pytest

from infra import keys, leases
from infra.processes import argv_of, cmdline_arg
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import FenceMemory
from tests.workers.agent_children import kill_children_of
from workers import agent
from workers.node import children, replicas

NODE = "tn-fence"
JOB = "jk-fence"
REPLICA = "count-1"
FAKE_STAGE = "tests.workers.sleeping_stage"


@pytest.fixture(autouse=True)
def lease_keys_cleared(redis_conn):
    ours = [
        keys.controller_lease(JOB),
        keys.controller_tenure(JOB),
        data_keys.commands_in_progress(JOB),
        data_keys.refused_commands(),
    ]
    redis_conn.delete(*ours)
    yield
    redis_conn.delete(*ours)


@pytest.fixture
def stage_agent(monkeypatch, tmp_path, settings):
    monkeypatch.setenv("BACKSTOP_NODE", NODE)
    monkeypatch.setattr(children, "ALLOWED_ENTRY_POINTS", {FAKE_STAGE: None})
    monkeypatch.setattr(agent, "_fence", FenceMemory())
    settings.VAR_DIR = tmp_path
    yield agent
    kill_children_of({JOB})


def start(lease: str) -> int:
    args = ["--job", JOB, "--stage", "count", "--role", "primary", "--replica-id", REPLICA,
            "--node", NODE]  # fmt: skip
    return agent.start_replica(FAKE_STAGE, args, REPLICA, JOB, lease=lease)


def processes() -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        argv = argv_of(proc.info["cmdline"])
        alive = proc.info["status"] != psutil.STATUS_ZOMBIE
        if alive and FAKE_STAGE in argv and cmdline_arg(argv, "--job") == JOB:
            found.append(proc.pid)
    return found


def refusals(client) -> list[dict]:
    return [entry for _, entry in client.xrange(data_keys.refused_commands())]


def test_a_stalled_controllers_start_and_kill_are_refused_and_its_successors_obeyed(
    redis_conn, stage_agent
):
    stalled = leases.Leases(redis_conn, "ctl-stalled", ttl_s=30)
    successor = leases.Leases(redis_conn, "ctl-successor", ttl_s=30)
    old_token = stalled.try_acquire(JOB)
    redis_conn.delete(keys.controller_lease(JOB))  # expired while ctl-stalled was paused
    assert start(old_token) == 0, "a start under an expired lease was carried out"
    new_token = successor.try_acquire(JOB)

    assert start(old_token) == 0
    assert processes() == []
    pid = start(new_token)
    assert pid > 0 and processes() == [pid]

    assert not agent.kill_replica(REPLICA, job_key=JOB, lease=old_token)
    time.sleep(0.3)
    assert processes() == [pid], "the stalled controller's kill was carried out"

    said = refusals(redis_conn)
    assert [(e["job"], e["command"], e["token"]) for e in said] == [
        (JOB, f"start {REPLICA}", old_token),
        (JOB, f"start {REPLICA}", old_token),
        (JOB, f"kill {REPLICA}", old_token),
    ]
    assert all(e["receiver"] == f"agent {NODE}" for e in said)
    assert "expired" in said[0]["reason"] and "ctl-successor" in said[1]["reason"]

    # The successor stops the job: its kill, queued before it gave the job up, still counts.
    successor.release(JOB)
    assert agent.kill_replica(REPLICA, job_key=JOB, lease=new_token)
    deadline = time.monotonic() + 10
    while processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes() == []


def test_a_lease_does_not_change_hands_while_the_agent_carries_out_its_holders_start(
    redis_conn, stage_agent, monkeypatch
):
    # The lease expires (its holder paused) between the agent's check and the process start: a
    # successor may not take the job over until the start is done, so the start never counts
    # as a command of a controller that lost the job.
    holder = leases.Leases(redis_conn, "ctl-holder", ttl_s=30)
    successor = leases.Leases(redis_conn, "ctl-successor", ttl_s=30)
    token = holder.try_acquire(JOB)
    taken_mid_start = []
    start_for_real = replicas.start

    def start_while_the_lease_expires(*args):
        redis_conn.delete(keys.controller_lease(JOB))
        taken_mid_start.append(successor.try_acquire(JOB))
        return start_for_real(*args)

    monkeypatch.setattr(replicas, "start", start_while_the_lease_expires)
    pid = start(token)
    assert pid > 0 and processes() == [pid]
    assert taken_mid_start == [None]
    assert successor.try_acquire(JOB) is not None, "the lease stayed held after the start"
    assert redis_conn.exists(data_keys.commands_in_progress(JOB)) == 0


def test_a_command_without_a_lease_is_an_operators_and_is_carried_out(redis_conn, stage_agent):
    leases.Leases(redis_conn, "ctl", ttl_s=30).try_acquire(JOB)
    pid = agent.start_replica(
        FAKE_STAGE,
        ["--job", JOB, "--stage", "count", "--role", "primary", "--replica-id", REPLICA,
         "--node", NODE],
        REPLICA,
        JOB,
    )  # fmt: skip
    assert processes() == [pid]
    assert agent.kill_replica(REPLICA, job_key=JOB)  # a fault injection's kill
    assert refusals(redis_conn) == []
