"""Two jobs with the same replica id on one node, through the node agent's own tasks and real
processes: replica ids are unique only within a job (every restart-all job's one replica is
`job-1`), so the agent keys its children by (job, replica id). Before, the second job's start
returned the first job's pid ("already running"), and a kill meant for one job's replica ended
the other's: the fleet simulator saw 3 of 10 restart-all jobs kill each other's `job-1`.

What is checked is read from the process table and Redis, not from the agent's records."""

import logging
import time

import psutil
import pytest

from infra import keys
from infra.processes import argv_of, cmdline_arg
from tests.conftest import wait_until
from tests.workers.agent_children import kill_children_of
from workers import agent
from workers.node import children

NODE = "tn-apart"
JOBS = ("jk-apart-a", "jk-apart-b")
REPLICA = "count-1"
FAKE_STAGE = "tests.workers.sleeping_stage"


@pytest.fixture(autouse=True)
def job_events_cleared(redis_conn):
    yield
    ours = [i for i, e in redis_conn.xrange(keys.agent_events()) if e.get("job") in JOBS]
    if ours:
        redis_conn.xdel(keys.agent_events(), *ours)


@pytest.fixture
def stage_agent(monkeypatch, tmp_path, settings):
    """The agent of NODE, allowed to start the sleeping stand-in instead of a Spark stage; the
    processes it starts are killed and forgotten afterwards."""
    monkeypatch.setenv("BACKSTOP_NODE", NODE)
    monkeypatch.setattr(children, "ALLOWED_ENTRY_POINTS", {FAKE_STAGE: None})
    settings.VAR_DIR = tmp_path
    yield agent
    kill_children_of(set(JOBS))


def stage_args(job: str) -> list[str]:
    return ["--job", job, "--stage", "count", "--role", "primary", "--replica-id", REPLICA,
            "--node", NODE]  # fmt: skip


def start(job: str) -> int:
    return agent.start_replica(FAKE_STAGE, stage_args(job), REPLICA, job)


def live(pid: int) -> bool:
    """Running, not a zombie (a killed child stays one until the agent reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def processes_of(job: str) -> list[int]:
    """Pids of live processes whose command line says they run REPLICA of `job`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        argv = argv_of(proc.info["cmdline"])
        if proc.info["status"] == psutil.STATUS_ZOMBIE or FAKE_STAGE not in argv:
            continue
        if cmdline_arg(argv, "--job") == job and cmdline_arg(argv, "--replica-id") == REPLICA:
            found.append(proc.pid)
    return found


def exits_of(client, job: str) -> list[dict]:
    events = [e for _, e in client.xrange(keys.agent_events()) if e.get("job") == job]
    return [e for e in events if e["kind"] == keys.EVENT_EXIT]


def test_two_jobs_run_the_same_replica_id_on_one_node_and_a_kill_ends_only_its_jobs(
    redis_conn, stage_agent
):
    job_a, job_b = JOBS
    pid_a = start(job_a)
    pid_b = start(job_b)
    assert pid_a != pid_b, "job B's start was taken for job A's"
    wait_until(
        lambda: processes_of(job_a) == [pid_a] and processes_of(job_b) == [pid_b],
        10,
        "processes_of(job_a) == [pid_a] and processes_of(job_b) == [pid_b]",
    )

    # Asked again (a redelivered message, a controller that retries), A's start is A's process.
    assert start(job_a) == pid_a
    assert start(job_b) == pid_b
    assert processes_of(job_a) == [pid_a] and processes_of(job_b) == [pid_b], "no second start"

    assert agent.kill_replica(REPLICA, "SIGKILL", job_key=job_a)
    wait_until(lambda: not live(pid_a), 10, "job A's process survived its kill")
    time.sleep(0.3)  # time for a wrong kill to land
    assert live(pid_b), "job A's kill ended job B's process"
    assert processes_of(job_b) == [pid_b]

    children.report_exits(redis_conn, NODE)
    [exit_a] = exits_of(redis_conn, job_a)
    assert (exit_a["replica_id"], exit_a["returncode"], exit_a["node"]) == (REPLICA, "-9", NODE)
    assert exits_of(redis_conn, job_b) == []

    # A's replica started again is a new process of A's, not B's running one.
    pid_a2 = start(job_a)
    assert pid_a2 not in (pid_a, pid_b)
    wait_until(lambda: processes_of(job_a) == [pid_a2], 10, "processes_of(job_a) == [pid_a2]")

    assert agent.kill_replica(REPLICA, "SIGTERM", job_key=job_b)
    wait_until(lambda: not live(pid_b), 10, "not live(pid_b)")
    time.sleep(0.3)
    assert live(pid_a2), "job B's kill ended job A's process"
    children.report_exits(redis_conn, NODE)
    [exit_b] = exits_of(redis_conn, job_b)
    assert (exit_b["replica_id"], exit_b["returncode"]) == (REPLICA, "-15")
    assert len(exits_of(redis_conn, job_a)) == 1, "A's second process still runs"


def test_a_kill_for_a_job_that_does_not_run_the_replica_here_kills_nothing(redis_conn, stage_agent):
    job_a, job_b = JOBS
    pid_a = start(job_a)
    assert not agent.kill_replica(REPLICA, job_key=job_b)
    time.sleep(0.3)
    assert live(pid_a)


def test_a_kill_without_a_job_key_from_an_older_controller_still_kills_and_warns(
    redis_conn, stage_agent, caplog
):
    """Queued before the upgrade: carried out by replica id alone, as then."""
    job_a, _job_b = JOBS
    pid_a = start(job_a)
    wait_until(lambda: processes_of(job_a) == [pid_a], 10, "processes_of(job_a) == [pid_a]")
    with caplog.at_level(logging.WARNING, logger=agent.log.name):
        assert agent.kill_replica(REPLICA)
    wait_until(lambda: not live(pid_a), 10, "not live(pid_a)")
    assert any("names no job" in r.getMessage() for r in caplog.records)


def test_a_start_whose_args_name_another_job_is_refused(stage_agent):
    job_a, job_b = JOBS
    with pytest.raises(ValueError, match="--job"):
        agent.start_replica(FAKE_STAGE, stage_args(job_a), REPLICA, job_b)
    assert processes_of(job_a) == [] and processes_of(job_b) == []
