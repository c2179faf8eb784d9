"""The node agent's side of kill-executor and kill-worker, against real processes and Redis.

The processes stand in for Spark's by their command lines only (a Spark worker JVM and the
executor JVMs it launched, each naming its application); the agent finds them the way it finds
Spark's, kills them, and reports on the agent events stream. The run against a real standalone
cluster is tests/integration/test_spark_cluster_live.py."""

import json
import subprocess
import sys
import time

import psutil
import pytest

from infra import keys
from infra.processes import argv_of
from workers import agent
from workers.node import faults

NODE = "tn-spark"
SLEEP = "import time; time.sleep(60)"


def executor_argv(app: str, executor_id: int) -> list[str]:
    return [sys.executable, "-c", SLEEP, faults.SPARK_EXECUTOR_CLASS,
            "--executor-id", str(executor_id), "--app-id", app]  # fmt: skip


@pytest.fixture(autouse=True)
def fault_keys_cleared(redis_conn):
    redis_conn.delete(keys.agent_events(), *(keys.fault_carried_out(i) for i in (901, 902, 903)))
    yield
    redis_conn.delete(keys.agent_events(), *(keys.fault_carried_out(i) for i in (901, 902, 903)))


@pytest.fixture(autouse=True)
def node_env(monkeypatch):
    monkeypatch.setenv("BACKSTOP_NODE", NODE)


@pytest.fixture
def worker():
    """A "worker" process that launched two executors of app-a and one of app-b."""
    spawn = (
        "import json, subprocess, sys, time; "
        "[subprocess.Popen(json.loads(a)) for a in sys.argv[2:]]; time.sleep(60)"
    )
    children = [executor_argv("app-a", 1), executor_argv("app-a", 0), executor_argv("app-b", 0)]
    proc = subprocess.Popen(
        [sys.executable, "-c", spawn, faults.SPARK_WORKER_CLASS, *map(json.dumps, children)]
    )
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 20
    while len(parent.children()) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    yield parent
    for p in [parent, *parent.children(recursive=True)]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
    proc.wait()


def events(client) -> list[dict]:
    return [fields for _, fields in client.xrange(keys.agent_events())]


def test_kill_executor_kills_the_applications_first_executor_only(redis_conn, worker):
    executors = faults.spark_executors("app-a")
    assert [argv_of(p.cmdline())[-3] for p in executors] == ["0", "1"]
    killed = agent.kill_spark_process("app-a", "kill-executor", fault_id=901, job_key="j1")
    assert killed == [executors[0].pid]
    psutil.wait_procs([executors[0]], timeout=5)
    assert [p.pid for p in faults.spark_executors("app-a")] == [executors[1].pid]
    assert worker.is_running()
    (event,) = events(redis_conn)
    assert (event["kind"], event["fault_id"], event["job"]) == ("spark-killed", "901", "j1")
    assert "killed Spark executor of app-a" in event["detail"]
    # The same task delivered again (acks_late) kills nothing more.
    assert agent.kill_spark_process("app-a", "kill-executor", fault_id=901, job_key="j1") == []
    assert len(faults.spark_executors("app-a")) == 1 and len(events(redis_conn)) == 1


def test_kill_worker_kills_the_worker_with_every_executor_it_launched(redis_conn, worker):
    everything = {worker.pid, *(p.pid for p in worker.children(recursive=True))}
    killed = agent.kill_spark_process("app-a", "kill-worker", fault_id=902, job_key="j1")
    assert set(killed) == everything
    (event,) = events(redis_conn)
    assert event["kind"] == "spark-killed"
    # Other applications' executors on that worker go too, and the report names them.
    assert "killed Spark worker of app-a" in event["detail"]
    assert "executors of app-a, app-b" in event["detail"]


def test_an_application_without_executors_here_is_refused_with_the_reason(redis_conn):
    assert agent.kill_spark_process("app-none", "kill-worker", fault_id=903, job_key="j1") == []
    (event,) = events(redis_conn)
    assert (event["kind"], event["fault"]) == ("refused", "kill-worker")
    assert "no Spark worker running an executor of Spark application app-none" in event["detail"]
