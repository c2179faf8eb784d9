"""Node resource sampling with psutil (no Django): what a node agent publishes every second.

Two scopes:
- `host`: the whole machine is the node (one agent per host, the production layout);
- `processes`: the node is the set of stage processes started with `--node NAME` and their
  children (the Spark JVMs). The demo runs three agents on one machine, so usage measured per
  host would be the same for all three and say nothing about where load sits.

Network use cannot be attributed to processes with psutil, so bandwidth is always the host's:
on one machine the demo's nodes really do share one network interface.
"""

from __future__ import annotations

import socket
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import psutil

# Process discovery lives in infra.processes. The names imported `as` themselves are re-exported
# for bench/strategy/run.py, which still imports them from here.
from infra.processes import argv_of as argv_of
from infra.processes import cmdline_arg as cmdline_arg
from infra.processes import node_processes, safe_read
from infra.processes import spare_processes as spare_processes
from infra.processes import stage_processes as stage_processes
from infra.processes import with_children as with_children
from spark_runtime.env import env

HOST = "host"
PROCESSES = "processes"
# One id per running kernel: agents on one machine share it, in containers too.
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def host_identity() -> str:
    """The host a node agent stands for, so the policy sees which nodes share one
    (console.policy.spares): BACKSTOP_NODE_HOST if set (a simulated node that stands for a host
    of its own), else the machine it runs on (`machine_identity`)."""
    named = env("BACKSTOP_NODE_HOST", "").strip()
    return named or machine_identity()


def machine_totals() -> dict[str, float]:
    """The cores and MiB of the machine an agent runs on, when its host is that machine
    (`host_cpu`, `host_mem_mb` of the heartbeat); {} for a simulated host
    (BACKSTOP_NODE_HOST), whose capacity is its agent's own. Agents sharing a machine may each
    report a share of its memory (the demo splits it between them) but share all of it: the
    host reserve judges the machine's figures (console.policy.reserve.host_loads)."""
    if env("BACKSTOP_NODE_HOST", "").strip():
        return {}
    return {
        "host_cpu": float(psutil.cpu_count() or 1),
        "host_mem_mb": round(psutil.virtual_memory().total / 2**20, 1),
    }


def machine_identity() -> str:
    """The machine this process runs on: the kernel's boot id, else the host name. Agents in
    containers on one machine have host names of their own but share the boot id, and they do
    share that machine's memory and cores (simulated hosts included: one warm-up at a time per
    machine, spark_runtime.spare.take_warmup_lock)."""
    try:
        return f"boot:{Path(BOOT_ID).read_text().strip()}"
    except OSError:
        return socket.gethostname()


@dataclass(frozen=True)
class Capacity:
    """What the node offers: cores, MiB of memory, disk MB/s, network Mbit/s."""

    cpu_total: float
    mem_total_mb: float
    disk_max_mbps: float
    bw_total_mbps: float


@dataclass(frozen=True, kw_only=True)
class Resources:
    """A node's resources at one instant, as its agent measures them: cores, MiB of memory, disk
    throughput and bandwidth (each used and available). The one definition of a usage sample's
    figures: the agent's NodeUsage and the policy's NodeSample (console.policy.resources) both
    extend it, and `RESOURCE_FIELDS` names them for code that reads or checks a published
    sample. Keyword-only, so a subclass's own fields (NodeSample's `name`) may come first."""

    cpu_total: float
    cpu_used: float
    mem_total: float
    mem_used: float
    disk_throughput: float
    disk_max_throughput: float
    bw_used: float
    bw_total: float


RESOURCE_FIELDS = tuple(f.name for f in fields(Resources))


@dataclass(frozen=True, kw_only=True)
class NodeUsage(Resources):
    """One sample, as the agent publishes it: the resources plus the time it was taken and how
    many processes were counted."""

    at: float
    processes: int

    def to_dict(self) -> dict:
        return asdict(self)


class ProcessTracker:
    """A changing set of processes (`select()` lists them now) whose CPU and memory are read
    between calls: psutil measures a process's CPU share since the previous call on the same
    object, so the objects are kept from one call to the next."""

    def __init__(self, select):
        self.select = select
        self._procs: dict[int, psutil.Process] = {}

    def current(self) -> list[psutil.Process]:
        """The selected processes, reusing the objects of the previous call."""
        found = {p.pid: p for p in self.select()}
        self._procs = {pid: self._procs.get(pid, proc) for pid, proc in found.items()}
        return list(self._procs.values())

    @staticmethod
    def usage(procs: list[psutil.Process]) -> tuple[float, float]:
        """(CPU in % of one core since the previous call, resident memory in MiB) of `procs`."""
        cpu = sum(safe_read(p.cpu_percent, 0.0) for p in procs)
        rss = sum(safe_read(lambda p=p: p.memory_info().rss, 0) for p in procs) / 2**20
        return cpu, rss


class NodeSampler:
    """Samples one node's usage; rates (CPU, disk, network) are measured between two calls."""

    def __init__(self, node: str, capacity: Capacity, scope: str = HOST):
        if scope not in (HOST, PROCESSES):
            raise ValueError(f"scope must be {HOST!r} or {PROCESSES!r}, got {scope!r}")
        self.node = node
        self.capacity = capacity
        self.scope = scope
        self._tracker = ProcessTracker(lambda: node_processes(node))
        self._last_at = time.monotonic()
        self._last_disk = self._disk_bytes([])
        self._last_net = self._net_bytes()
        psutil.cpu_percent(None)

    def sample(self) -> NodeUsage:
        now = time.monotonic()
        elapsed = max(now - self._last_at, 1e-3)
        procs = self._tracker.current() if self.scope == PROCESSES else []
        if self.scope == HOST:
            cpu_used = psutil.cpu_percent(None) / 100.0 * (psutil.cpu_count() or 1)
            mem_used = (psutil.virtual_memory().total - psutil.virtual_memory().available) / 2**20
        else:
            cpu_percent, mem_used = ProcessTracker.usage(procs)
            cpu_used = cpu_percent / 100.0
        disk = self._disk_bytes(procs)
        net = self._net_bytes()
        usage = NodeUsage(
            at=time.time(),
            cpu_total=self.capacity.cpu_total,
            cpu_used=round(min(cpu_used, self.capacity.cpu_total), 3),
            mem_total=self.capacity.mem_total_mb,
            mem_used=round(mem_used, 1),
            disk_throughput=round(max(disk - self._last_disk, 0) / elapsed / 1e6, 3),
            disk_max_throughput=self.capacity.disk_max_mbps,
            bw_used=round(max(net - self._last_net, 0) * 8 / elapsed / 1e6, 3),
            bw_total=self.capacity.bw_total_mbps,
            processes=len(procs),
        )
        self._last_at, self._last_disk, self._last_net = now, disk, net
        return usage

    def _disk_bytes(self, procs: list[psutil.Process]) -> int:
        if self.scope == HOST:
            counters = psutil.disk_io_counters()
            return (counters.read_bytes + counters.write_bytes) if counters else 0
        total = 0
        for proc in procs:
            io = safe_read(proc.io_counters, None)
            if io is not None:
                total += io.read_bytes + io.write_bytes
        return total

    @staticmethod
    def _net_bytes() -> int:
        counters = psutil.net_io_counters()
        return (counters.bytes_sent + counters.bytes_recv) if counters else 0
