"""A node agent that restarted watches the replica processes its earlier run started, as it
watches its own children: their exits reach the controller within a poll, not 3 s later by the
missing heartbeat (the soak's slowest kill-driver recovery was such a replica, docs/RESULTS.md).
A warm spare of the earlier run that this agent hands a replica is watched the same way.

Real processes with a stage's command line (they run no Spark), a real Redis and database; the
agent's own code adopts, reports and the controller's own code reads the reports."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from console.services.control.act import AgentLauncher
from console.services.control.observe import read_agent_events
from console.services.control.record import failure_report
from infra import keys
from infra.processes import SPARE_MODULE, STAGE_MODULE
from spark_runtime import keys as data_keys
from tests.factories import make_job
from tests.workers.agent_children import kill_children_of
from workers.node import children

NODE = "tn-adopt"
OTHER_NODE = "tn-adopt-other"

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(redis_conn):
    job = make_job(status="running")
    yield job
    ours = [i for i, e in redis_conn.xrange(keys.agent_events()) if e.get("job") == job.key]
    if ours:
        redis_conn.xdel(keys.agent_events(), *ours)
    redis_conn.delete(
        keys.exits(job.key),
        keys.exit_tails(job.key),
        keys.agent_events_cursor(job.key),
        data_keys.replicas(job.key),
    )
    kill_children_of({job.key})


@pytest.fixture
def processes():
    """Starts processes with a given command line (none of them the agent's own child) and
    kills what is left of them at the end."""
    started: list[subprocess.Popen] = []

    def start(module: str, *args: str, log: Path | None = None) -> subprocess.Popen:
        # The arguments after -c's program are its argv: the agent reads a stage's there.
        code = "import time; print('last words', flush=True); time.sleep(60)"
        if log is None:
            proc = subprocess.Popen([sys.executable, "-c", code, module, *args])
        else:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as out:
                proc = subprocess.Popen([sys.executable, "-c", code, module, *args], stdout=out)
        started.append(proc)
        deadline = time.monotonic() + 10
        while module not in " ".join(_cmdline(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().decode().split("\0")


def exit_events(client, job_key: str) -> list[dict]:
    return [
        e
        for _, e in client.xrange(keys.agent_events())
        if e.get("job") == job_key and e["kind"] == keys.EVENT_EXIT
    ]


def report_until_published(client, job_key: str, timeout_s: float = 5.0) -> list[dict]:
    """The agent's exit poll, run until it published an exit of the job."""
    deadline = time.monotonic() + timeout_s
    while not exit_events(client, job_key) and time.monotonic() < deadline:
        children.report_exits(client, NODE)
        time.sleep(0.02)
    return exit_events(client, job_key)


def test_a_restarted_agent_reports_the_exit_of_a_replica_its_earlier_run_started(
    redis_conn, job, processes, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    stage_args = ("--job", job.key, "--stage", "count", "--role", "primary")
    # A spare that became count-1: it writes on in the spare's log, its standard output.
    log = children.stage_log_path("spare-was")
    ours = processes(STAGE_MODULE, *stage_args, "--replica-id", "count-1", "--node", NODE, log=log)
    processes(STAGE_MODULE, *stage_args, "--replica-id", "count-2", "--node", OTHER_NODE)
    processes(SPARE_MODULE, "--node", NODE, "--spare-id", "spare-idle")
    became_at = time.time() - 30  # what the stage wrote when it became count-1
    entry = {"pid": ours.pid, "started_at": became_at, "state": "running"}
    redis_conn.hset(data_keys.replicas(job.key), "count-1", json.dumps(entry))
    while "last words" not in children.log_tail(log):
        time.sleep(0.02)

    adopted = children.adopt_running(redis_conn, NODE)

    assert adopted == [(job.key, "count-1")], "only this node's replicas, not its idle spares"
    assert children.adopt_running(redis_conn, NODE) == [], "adopted once"
    assert ("count-1", ours.pid, job.key) in children.live_replicas()

    launched_at = became_at - 1  # the controller asked for it just before it started
    ours.send_signal(signal.SIGKILL)
    [event] = report_until_published(redis_conn, job.key)
    assert event["replica_id"] == "count-1" and event["returncode"] == ""
    assert float(event["since"]) == pytest.approx(became_at)
    assert "last words" in event["log_tail"]

    # The controller takes it for the exit of the run it asked for, with no code.
    read_agent_events(redis_conn, job, {"count-1": launched_at})
    launcher = AgentLauncher(job, redis_conn)
    assert not launcher.alive("count-1")
    assert launcher.exit_code("count-1") is None
    status, _tail = failure_report(redis_conn, job, "count-1", "ProcessExited")
    assert status.startswith("exited (its code unknown")
    assert job.key not in {key for key, _id in children._children}, "forgotten once published"


def test_a_spare_of_the_earlier_run_handed_a_replica_is_watched(
    redis_conn, job, processes, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    spare_log = children.stage_log_path("spare-old")
    spare = processes(SPARE_MODULE, "--node", NODE, "--spare-id", "spare-old", log=spare_log)
    while "last words" not in children.log_tail(spare_log):
        time.sleep(0.02)
    before = time.time()
    children.hand_over("spare-old", spare.pid, job.key, "count-1", warming=False)

    assert ("count-1", spare.pid, job.key) in children.live_replicas()
    assert children.running_replica("count-1", job.key).pid == spare.pid

    spare.send_signal(signal.SIGKILL)
    [event] = report_until_published(redis_conn, job.key)
    assert event["replica_id"] == "count-1" and event["returncode"] == ""
    assert before <= float(event["since"]) <= time.time()
    assert "last words" in event["log_tail"], "the spare's own log, which it writes on in"
