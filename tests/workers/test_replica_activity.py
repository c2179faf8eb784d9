"""Dead versus slow, below the state machine: the CPU a replica's process tree uses, as the
node agent publishes it and the controller reads it, against real processes and Redis."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.conf import settings

from console.services.control.act import AgentLauncher
from infra import keys
from spark_runtime.activity import ActivityMeter, cpu_share_over, is_busy
from tests.factories import make_job
from workers.node import children, loops

# A parent that spins in a child (like a stage whose JVM does the work), and an idle one.
SPINNING_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'while True: pass']); time.sleep(60)"
)
IDLE = "import time; time.sleep(60)"
# A parent that does its work in short-lived children, one after the other (like a JVM running
# commands): each spins 0.2 s and ends, appending its own CPU seconds and its end to the file
# named by the parent's argument, so the test knows what they used without asking the meter.
SHORT_LIVED_CHILDREN = (
    "import subprocess, sys\n"
    "spin = ('import sys, time\\nt = time.time()\\nwhile time.time() - t < 0.2: pass\\n'\n"
    '        \'open(sys.argv[1], "a").write(f"{time.process_time()} {time.time()}\\\\n")\')\n'
    "while True: subprocess.run([sys.executable, '-c', spin, sys.argv[1]])"
)


def proc_tree_rss_mb(pid: int) -> float:
    """VmRSS of `pid` and its children from /proc (kB -> MiB)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    total_kb = 0
    for each in [pid, *map(int, children)]:
        for line in Path(f"/proc/{each}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024


def _start(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True)


@pytest.fixture
def processes():
    started = []

    def start(code, *args):
        proc = _start(code, *args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_busy_is_the_cpu_of_the_whole_tree_and_a_stopped_tree_is_not_busy(processes):
    spinning, idle = processes(SPINNING_CHILD), processes(IDLE)
    time.sleep(0.5)  # the child is started
    assert is_busy(cpu_share_over(spinning.pid, 0.5))  # the parent sleeps; its child works
    assert not is_busy(cpu_share_over(idle.pid, 0.5))
    os.killpg(spinning.pid, signal.SIGSTOP)  # pause-node: the whole group is stopped
    try:
        assert cpu_share_over(spinning.pid, 0.5) == 0.0
    finally:
        os.killpg(spinning.pid, signal.SIGCONT)
    meter = ActivityMeter()
    assert meter.cpu_share(idle.pid) is None  # a first look has nothing to compare with
    os.killpg(idle.pid, signal.SIGKILL)
    idle.wait()
    assert meter.cpu_share(idle.pid) is None  # gone


def test_the_cpu_of_children_that_ended_counts_for_their_tree(processes, tmp_path):
    """Children that ran and ended in the window are charged to the tree (their time is in
    their parent's children times once reaped). What they used is what they wrote down
    themselves, so the check holds however busy the machine is (about one core when idle)."""
    spent = tmp_path / "children-cpu"
    parent = processes(SHORT_LIVED_CHILDREN, str(spent))
    time.sleep(0.5)
    started = time.time()
    share = cpu_share_over(parent.pid, 2.0)
    ended = time.time()
    children = [tuple(map(float, line.split())) for line in spent.read_text().splitlines()]
    # CPU of the children that ended inside the window; one that began before it is charged
    # whole when reaped, so the meter may count up to one child's 0.2 s more, or a reap late.
    inside = sum(cpu for cpu, end in children if started <= end <= ended) / (ended - started)
    assert inside >= 0.05  # children ran and ended in the window
    # Without the ended children it read 0.02 on an idle machine, a fortieth of what they
    # used; a child reaped after the window is missing from the meter's share (0.1 at most).
    assert 0.5 * inside <= share <= inside + 0.25, (share, inside)


@pytest.mark.django_db
def test_the_agent_publishes_activity_and_the_controller_reads_it(processes, monkeypatch):
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    job = make_job()
    spinning, idle = processes(SPINNING_CHILD), processes(IDLE)
    agent_children = {
        (job.key, "count-1"): (spinning, job.key, None),
        (job.key, "split-1"): (idle, job.key, None),
        ("", "spare-x"): (processes(IDLE), "", None),  # a warm spare: no job, not published
    }
    monkeypatch.setattr(children, "_children", agent_children)
    loops.publish_activity(client)  # the first round only takes a sample
    time.sleep(1.0)
    loops.publish_activity(client)
    published = client.hgetall(keys.replica_activity(job.key))
    assert sorted(published) == ["count-1", "split-1"]
    # The policy's figures: the average starts at the first share, and the memory is the whole
    # tree's (the spinning parent and its child), as /proc counts it.
    entry = json.loads(published["count-1"])
    assert entry["cpu_avg"] == entry["cpu"] > 0.05
    assert entry["rss_mb"] == pytest.approx(proc_tree_rss_mb(spinning.pid), rel=0.2)
    assert 0 < client.ttl(keys.replica_activity(job.key)) <= keys.ACTIVITY_TTL_S
    launcher = AgentLauncher(job, client)
    assert launcher.busy("count-1") and not launcher.busy("split-1")
    assert not launcher.busy("unknown-1")
    client.delete(keys.replica_activity(job.key))
