"""Measure what a lower CPU priority gives a stage process on this machine.

    python -m bench.dataplane.cpu_priority [--seconds 5] [--levels 5,10,19]

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
from pathlib import Path

from spark_runtime.cpu_priority import set_group_nice

NICE_ONLY = "nice only"
NICE_AND_AUTOGROUP = "nice and autogroup"


def _spin(level: int, how: str, start_at: float, end_at: float, cpu: int) -> None:
    """Child body: take the priority, then burn CPU on `cpu` from `start_at` to `end_at` (epoch
    seconds, the same for both children) and print the CPU seconds that took."""
    os.sched_setaffinity(0, {cpu})
    if how == NICE_ONLY:
        os.setpriority(os.PRIO_PGRP, 0, level)
    else:
        set_group_nice(level)
    time.sleep(max(0.0, start_at - time.time()))
    used = time.process_time()
    while time.time() < end_at:
        pass
    print(time.process_time() - used)


def _start(level: int, how: str, start_at: float, end_at: float, cpu: int) -> subprocess.Popen:
    code = (
        "from bench.dataplane.cpu_priority import _spin; "
        f"_spin({level}, {how!r}, {start_at}, {end_at}, {cpu})"
    )
    # The child imports this module from wherever the caller runs: the project root on its path.
    root = str(Path(__file__).resolve().parents[2])
    paths = [root, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
    return subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, env=env, stdout=subprocess.PIPE
    )


def low_priority_share(level: int, how: str, seconds: float = 3.0, cpu: int = 0) -> float:
    """The share of one CPU that a process at `level` (set `how`) got against one at nice 0,
    both spinning over the same `seconds` (after a second to start)."""
    start_at = time.time() + 1.0
    end_at = start_at + seconds
    normal = _start(0, how, start_at, end_at, cpu)
    low = _start(level, how, start_at, end_at, cpu)
    normal_s = float(normal.communicate()[0])
    low_s = float(low.communicate()[0])
    return low_s / (normal_s + low_s)


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the low-priority share per level, both ways."""
    parser = argparse.ArgumentParser(prog="python -m bench.dataplane.cpu_priority")
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
