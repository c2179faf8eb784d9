"""Is a replica's process doing work, and how much does it use? The CPU its process tree (the
Python stage and its JVM) used between two looks. Launchers ask it when a heartbeat is missing,
to tell a slow replica (busy, its heartbeat thread starved) from a dead or hung one (see
supervision.py); the policy scores operators from the averaged CPU and the memory of their
stage's process tree once it runs (console/policy/priority.py, `measured_demands`)."""

from __future__ import annotations

import math
import time

import psutil

# A process tree using at least this share of one core between two looks is busy.
BUSY_CPU_SHARE = 0.05
# The averaged CPU share forgets with this time constant: a policy cycle sees the load of the
# last half minute or so, not one second's burst.
AVERAGE_S = 30.0


def process_cpu_s(times) -> float:
    """CPU seconds in psutil `cpu_times()`: the process's own and its reaped children's."""
    return times.user + times.system + times.children_user + times.children_system


def tree_cpu_seconds(pid: int) -> tuple[float, bool] | None:
    """(user + system CPU seconds of the process and its descendants, stopped by a signal), or
    None when the process is gone. Descendants that ended count too (their time is in their
    parent's children times once reaped): a JVM that runs short-lived commands pays for them."""
    try:
        root = psutil.Process(pid)
        stopped = root.status() == psutil.STATUS_STOPPED
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue  # a child that just ended
            total += process_cpu_s(times)
        return total, stopped
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def tree_rss_mb(pid: int) -> float | None:
    """Resident memory of the process and its descendants in MiB (pages shared between them
    count once per process), or None when the process is gone."""
    try:
        root = psutil.Process(pid)
        total = 0
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue  # a child that just ended
        return total / 2**20
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def pss_mb(procs: list[psutil.Process]) -> float | None:
    """Proportional set size of `procs` in MiB: each page counted once, split between the
    processes that map it (forked workers, shared libraries), so unlike summed RSS it does not
    count shared pages once per process. Read from /proc/PID/smaps_rollup by psutil (Linux);
    None where psutil has no PSS (other platforms). Slower than RSS (the kernel walks the page
    tables), hence apart from `ProcessTracker.usage` (infra/node_metrics.py), which node
    agents call every second."""
    total = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # ended mid-read: gone
        if not hasattr(info, "pss"):
            return None
        total += info.pss
    return total / 2**20


class ActivityMeter:
    """The CPU share of process trees since the previous look at each, and its average over
    about `AVERAGE_S` (one meter per watcher)."""

    def __init__(self):
        self._seen: dict[int, tuple[float, float]] = {}  # pid -> (time, CPU seconds)
        self._average: dict[int, float] = {}  # pid -> averaged share of a core

    def cpu_share(self, pid: int, now: float | None = None) -> float | None:
        """Share of one core used since the previous call for `pid` (None on the first call,
        or when the process is gone); 0 while it is stopped by a signal."""
        now = time.monotonic() if now is None else now
        sample = tree_cpu_seconds(pid)
        if sample is None:
            self._seen.pop(pid, None)
            self._average.pop(pid, None)
            return None
        cpu_s, stopped = sample
        previous = self._seen.get(pid)
        if previous is not None:
            # A child reaped between the reads of its parent and of itself is in neither: the
            # reading dips, and the child's time comes back in its parent's at the next look.
            # Keeping the higher total makes that look count only what is new.
            cpu_s = max(cpu_s, previous[1])
        self._seen[pid] = (now, cpu_s)
        if previous is None or now <= previous[0]:
            return None
        share = 0.0 if stopped else max(0.0, (cpu_s - previous[1]) / (now - previous[0]))
        # An exponential moving average over time (looks need not be evenly spaced).
        weight = 1.0 - math.exp(-(now - previous[0]) / AVERAGE_S)
        average = self._average.get(pid, share)
        self._average[pid] = average + weight * (share - average)
        return share

    def cpu_average(self, pid: int) -> float | None:
        """The share of one core `pid`'s tree used, averaged over about `AVERAGE_S` of looks
        (None before a second look)."""
        return self._average.get(pid)

    def forget_others(self, pids: set[int]) -> None:
        """Drop what is remembered about processes not in `pids` (ended ones)."""
        for pid in set(self._seen) - pids:
            del self._seen[pid]
            self._average.pop(pid, None)


def cpu_share_over(pid: int, window_s: float = 0.3) -> float | None:
    """The CPU share of `pid`'s tree measured over `window_s` (blocks that long); for watchers
    that do not sample continuously."""
    meter = ActivityMeter()
    meter.cpu_share(pid)
    time.sleep(window_s)
    return meter.cpu_share(pid)


def is_busy(share: float | None) -> bool:
    """True for a CPU share that counts as doing work."""
    return share is not None and share >= BUSY_CPU_SHARE
