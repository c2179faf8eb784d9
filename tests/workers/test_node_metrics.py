"""Node sampling with psutil against real processes."""

import os
import subprocess
import sys
import time

import pytest

from infra import node_metrics
from infra.node_metrics import HOST, PROCESSES, Capacity, NodeSampler
from infra.processes import node_processes

CAPACITY = Capacity(cpu_total=2.0, mem_total_mb=4096.0, disk_max_mbps=100.0, bw_total_mbps=1000.0)


@pytest.fixture
def busy_stage():
    """A process that looks like a stage of node 'tn-1' to the sampler and burns one core."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "while True: pass", "spark_runtime.stage", "--node", "tn-1"]
    )
    yield proc
    proc.kill()
    proc.wait()


def test_processes_scope_counts_only_the_nodes_processes(busy_stage):
    assert [p.pid for p in node_processes("tn-1")] == [busy_stage.pid]
    assert node_processes("tn-2") == []
    sampler = NodeSampler("tn-1", CAPACITY, scope=PROCESSES)
    sampler.sample()  # first call primes psutil's CPU counters
    time.sleep(1.0)
    usage = sampler.sample()
    assert usage.processes == 1
    # A busy loop uses up to one core; on a loaded machine it may get much less, never none.
    assert 0.02 < usage.cpu_used <= 1.1
    assert 0 < usage.mem_used < 200
    other = NodeSampler("tn-2", CAPACITY, scope=PROCESSES)
    other.sample()
    time.sleep(0.2)
    assert other.sample().cpu_used == 0.0


def test_host_scope_reports_the_machine():
    sampler = NodeSampler("host", CAPACITY, scope=HOST)
    time.sleep(0.2)
    usage = sampler.sample()
    assert usage.cpu_total == 2.0 and usage.mem_total == 4096.0
    assert usage.mem_used > 0
    assert usage.bw_total == 1000.0


def test_unknown_scope_is_refused():
    with pytest.raises(ValueError, match="scope"):
        NodeSampler("x", CAPACITY, scope="galaxy")


def start_holding(code: str) -> subprocess.Popen:
    """A child Python that runs `code` (which prints "ready" once its memory is touched), then
    sleeps until killed; returned once it is ready."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


# 50 MiB written byte by byte (b"x" * n fills them), so every page is resident.
HOLD_50_MB = "import time; data = b'x' * (50 * 2**20); print('ready', flush=True); time.sleep(60)"


def test_pss_of_a_process_counts_the_memory_it_touched():
    import psutil

    from spark_runtime.activity import pss_mb

    holder = start_holding(HOLD_50_MB)
    try:
        proc = psutil.Process(holder.pid)
        pss = pss_mb([proc])
        rss = proc.memory_info().rss / 2**20
        # Its 50 MiB are its own (counted whole); the interpreter's shared libraries only in part.
        assert 50 <= pss <= rss
    finally:
        holder.kill()
        holder.wait()


def test_pss_counts_pages_shared_by_forked_processes_once():
    """What summed RSS gets wrong: a forked child shares its parent's 50 MiB (copy-on-write),
    which RSS counts in each process and PSS splits between them."""
    import psutil

    from infra.node_metrics import ProcessTracker
    from spark_runtime.activity import pss_mb

    holder = start_holding(
        "import os, time; data = b'x' * (50 * 2**20)\n"
        "if os.fork() == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print('ready', flush=True); time.sleep(60)"
    )
    parent = psutil.Process(holder.pid)
    procs = [parent, *parent.children()]
    try:
        assert len(procs) == 2
        _, rss = ProcessTracker.usage(procs)
        pss = pss_mb(procs)
        assert rss >= 100  # the 50 MiB twice
        assert 50 <= pss < rss - 40  # once
    finally:
        for proc in procs:
            proc.kill()
        holder.wait()


def test_pss_counts_an_ended_process_as_gone_and_is_none_without_pss():
    from collections import namedtuple

    import psutil

    from spark_runtime.activity import pss_mb

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    proc = psutil.Process(ended.pid)
    ended.wait()
    assert pss_mb([proc]) == 0.0

    class NoPss:
        """A process on a platform whose psutil reads no PSS (its full info is RSS and VMS)."""

        def memory_full_info(self):
            return namedtuple("pmem", "rss vms")(rss=2**20, vms=2**21)

    assert pss_mb([NoPss()]) is None


def test_agents_on_one_machine_report_one_host_unless_told_otherwise(monkeypatch, tmp_path):
    # Two containers on one machine: host names of their own, one kernel (one boot id).
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("0f1e2d3c-aaaa-bbbb-cccc-000000000001\n")
    monkeypatch.setattr(node_metrics, "BOOT_ID", str(boot_id))
    monkeypatch.delenv("BACKSTOP_NODE_HOST", raising=False)
    seen = set()
    for container in ("agent-1-container", "agent-2-container"):
        monkeypatch.setattr(node_metrics.socket, "gethostname", lambda name=container: name)
        seen.add(node_metrics.host_identity())
    assert seen == {"boot:0f1e2d3c-aaaa-bbbb-cccc-000000000001"}
    # Without a boot id (not Linux): the host name.
    monkeypatch.setattr(node_metrics, "BOOT_ID", str(tmp_path / "missing"))
    assert node_metrics.host_identity() == "agent-2-container"
    # Named explicitly: a simulated node that stands for a host of its own.
    monkeypatch.setenv("BACKSTOP_NODE_HOST", "rack-2-host-7")
    assert node_metrics.host_identity() == "rack-2-host-7"
    # The machine stays the machine (one spare warm-up at a time on its cores).
    assert node_metrics.machine_identity() == "agent-2-container"


def test_an_agent_on_its_machine_reports_the_machines_cores_and_memory(monkeypatch):
    monkeypatch.delenv("BACKSTOP_NODE_HOST", raising=False)
    totals = node_metrics.machine_totals()
    assert totals["host_cpu"] == os.cpu_count()
    with open("/proc/meminfo") as meminfo:  # MemTotal, in kB
        kb = int(next(line for line in meminfo if line.startswith("MemTotal:")).split()[1])
    assert totals["host_mem_mb"] == pytest.approx(kb / 1024, abs=1)
    # A simulated host's capacity is its agent's own: no machine figures.
    monkeypatch.setenv("BACKSTOP_NODE_HOST", "rack-2-host-7")
    assert node_metrics.machine_totals() == {}
