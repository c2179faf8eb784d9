"""Is a replica's process doing work? The CPU its process tree (the Python stage and its JVM)
used between two looks. Launchers ask it when a heartbeat is missing, to tell a slow replica
(busy, its heartbeat thread starved) from a dead or hung one (see supervision.py)."""

from __future__ import annotations

import time

import psutil

# A process tree using at least this share of one core between two looks is busy.
BUSY_CPU_SHARE = 0.05


def tree_cpu_seconds(pid: int) -> tuple[float, bool] | None:
    """(user + system CPU seconds of the process and its descendants, stopped by a signal), or
    None when the process is gone."""
    try:
        root = psutil.Process(pid)
        stopped = root.status() == psutil.STATUS_STOPPED
        total = 0.0
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue  # a child that just ended
            total += times.user + times.system
        return total, stopped
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


class ActivityMeter:
    """The CPU share of process trees since the previous look at each (one meter per watcher)."""

    def __init__(self):
        self._seen: dict[int, tuple[float, float]] = {}  # pid -> (time, CPU seconds)

    def cpu_share(self, pid: int, now: float | None = None) -> float | None:
        """Share of one core used since the previous call for `pid` (None on the first call,
        or when the process is gone); 0 while it is stopped by a signal."""
        now = time.monotonic() if now is None else now
        sample = tree_cpu_seconds(pid)
        if sample is None:
            self._seen.pop(pid, None)
            return None
        cpu_s, stopped = sample
        previous = self._seen.get(pid)
        self._seen[pid] = (now, cpu_s)
        if previous is None or now <= previous[0]:
            return None
        return 0.0 if stopped else max(0.0, (cpu_s - previous[1]) / (now - previous[0]))

    def forget_others(self, pids: set[int]) -> None:
        """Drop what is remembered about processes not in `pids` (ended ones)."""
        for pid in set(self._seen) - pids:
            del self._seen[pid]


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
