"""Measure what a lower CPU priority gives a stage process on this machine.

    python -m spark_runtime.bench_cpu_priority [--seconds 5] [--levels 5,10,19]

Two CPU-bound processes, each in a session of its own as node agents start stages and spares,
are pinned to one CPU so they compete for it; one runs at nice 0, the other at a lower priority
set either with the nice level alone or with `cpu_priority.set_group_nice` (nice level and
autogroup). Prints the low-priority process's share of the CPU time the two got.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from spark_runtime.cpu_priority import set_group_nice

NICE_ONLY = "nice only"
NICE_AND_AUTOGROUP = "nice and autogroup"


def _spin(level: int, how: str, seconds: float, cpu: int) -> None:
    """Child body: take the priority, then burn CPU on `cpu` for `seconds` of wall time."""
    os.sched_setaffinity(0, {cpu})
    if how == NICE_ONLY:
        os.setpriority(os.PRIO_PGRP, 0, level)
    else:
        set_group_nice(level)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _start(level: int, how: str, seconds: float, cpu: int) -> subprocess.Popen:
    code = (
        "from spark_runtime.bench_cpu_priority import _spin; "
        f"_spin({level}, {how!r}, {seconds}, {cpu})"
    )
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _cpu_seconds(proc: subprocess.Popen) -> float:
    """Wait for `proc`; its user + system CPU seconds."""
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


def low_priority_share(level: int, how: str, seconds: float = 3.0, cpu: int = 0) -> float:
    """The share of one CPU that a process at `level` (set `how`) got against one at nice 0."""
    normal = _start(0, how, seconds, cpu)
    low = _start(level, how, seconds, cpu)
    normal_s, low_s = _cpu_seconds(normal), _cpu_seconds(low)
    return low_s / (normal_s + low_s)


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the low-priority share per level, both ways."""
    parser = argparse.ArgumentParser(prog="python -m spark_runtime.bench_cpu_priority")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--levels", default="5,10,19")
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.levels.split(",")]
    print(
        f"CPU share of the lower-priority process of two on one CPU ({args.seconds:g} s each; "
        "an equal share is 50%)"
    )
    print("| nice | nice only | nice and autogroup |")
    print("|---|---|---|")
    for level in levels:
        shares = [
            low_priority_share(level, how, args.seconds) for how in (NICE_ONLY, NICE_AND_AUTOGROUP)
        ]
        print(f"| {level} | " + " | ".join(f"{share:.0%}" for share in shares) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
