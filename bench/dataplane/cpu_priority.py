"""Measure what a lower CPU priority gives a stage process on this machine.

    python -m bench.dataplane.cpu_priority [--seconds 5] [--levels 5,10,19]

Two CPU-bound processes, each in a session of its own as node agents start stages and spares,
are pinned to one CPU so they compete for it; one runs at nice 0, the other at a lower priority
set either with the nice level alone or with `cpu_priority.set_group_nice` (nice level and
autogroup). Prints the low-priority process's share of the CPU time the two got.

    python -m bench.dataplane.cpu_priority --recovery [--runs 2] [--load 2] [--timeout 60]

Recovery first: `--load` processes stand for the steady primaries of other jobs (each in a
session of its own at strategies.PRIMARY_NICE, spinning on every CPU) while a recovering stage
starts: a new Python process that builds the stages' SparkSession (spark_runtime.config's, the
JVM included) and computes its first result, as a restarted stage does before its first output.
Prints its time to first output (as its parent sees it, which gives the new session its
priority at once, as node agents do) at the normal level (what a restarting stage had before the
recovery class), at the steady primaries' level and at strategies.RECOVERING_NICE.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from spark_runtime.config import build_session
from spark_runtime.cpu_priority import set_group_nice, set_session_nice
from spark_runtime.strategies import PRIMARY_NICE, RECOVERING_NICE

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


def _load_forever(level: int) -> None:
    """Child body: a steady primary of another job, at `level`, using a whole CPU."""
    set_group_nice(level)
    while True:
        pass


def _first_output() -> None:
    """Child body: a restarting stage's work up to its first output (the stages' SparkSession,
    its JVM included, and a first aggregation); prints the result's group count."""
    spark = build_session("backstop-recovery-bench")
    rows = spark.range(200_000).selectExpr("id % 100 AS k").groupBy("k").count().collect()
    print(len(rows), flush=True)
    spark.stop()


def _child(body: str) -> subprocess.Popen:
    """A process in a session of its own (as a node agent starts a stage) running `body`."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [root, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in paths if path)}
    code = f"from bench.dataplane.cpu_priority import _first_output, _load_forever; {body}"
    return subprocess.Popen(
        [sys.executable, "-c", code], start_new_session=True, env=env, stdout=subprocess.PIPE
    )


def time_to_first_output(level: int, load: int, timeout_s: float) -> float | None:
    """Seconds a stage restarting at `level` takes to its first result while `load` steady
    primaries (at PRIMARY_NICE) keep the CPUs busy; None if it took over `timeout_s`."""
    loaders = [_child(f"_load_forever({PRIMARY_NICE})") for _ in range(load)]
    stage = None
    try:
        time.sleep(2.0)  # the load is on every CPU before the stage restarts
        started = time.monotonic()
        stage = _child("_first_output()")
        # As a node agent does: the priority is the new session's before it has run a line.
        set_session_nice(stage.pid, level)
        ready, _, _ = select.select([stage.stdout], [], [], timeout_s)
        if not ready:
            return None  # no output within timeout_s: the stage is killed below
        line = stage.stdout.readline()  # its first output, or nothing if it died
        seconds = time.monotonic() - started
        if line.strip() != b"100":
            raise RuntimeError(f"the first result is {line!r}, not 100 groups")
        return seconds
    finally:
        # Every child leads a session of its own: its whole group goes (the stage's JVM too).
        for child in [*loaders, *([stage] if stage else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def recovery_table(runs: int, load: int, timeout_s: float) -> list[str]:
    """Markdown rows: time to first output per level, runs interleaved so that the machine's
    other load falls on every level alike (a run over `timeout_s` counts as that, "> N")."""
    levels = [(f"recovering ({RECOVERING_NICE})", RECOVERING_NICE),
              (f"steady primary ({PRIMARY_NICE})", PRIMARY_NICE),
              ("normal (0: before the recovery class)", 0)]  # fmt: skip
    times: dict[int, list[float | None]] = {level: [] for _, level in levels}
    for _ in range(runs):
        for _, level in levels:
            times[level].append(time_to_first_output(level, load, timeout_s))
    rows = ["| recovering stage at | time to first output, s (runs) | median |", "|---|---|---|"]
    for label, level in levels:
        over = f"> {timeout_s:g}"
        runs_s = ", ".join(over if t is None else f"{t:.1f}" for t in times[level])
        median = statistics.median(timeout_s if t is None else t for t in times[level])
        rows.append(f"| {label} | {runs_s} | {median:.1f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the low-priority share per level, both ways."""
    parser = argparse.ArgumentParser(prog="python -m bench.dataplane.cpu_priority")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--levels", default="5,10,19")
    parser.add_argument("--recovery", action="store_true", help="time to first output instead")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--load", type=int, default=2, help="steady primaries spinning")
    parser.add_argument("--timeout", type=float, default=60.0, help="longest wait per restart")
    args = parser.parse_args(argv)
    if args.recovery:
        print(
            f"Time to first output of a restarting stage while {args.load} steady primaries "
            f"(nice {PRIMARY_NICE}) spin on {os.cpu_count()} CPUs"
        )
        # A SIGTERM (a `timeout`) unwinds, so the children are killed with their groups.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        for row in recovery_table(args.runs, args.load, args.timeout):
            print(row, flush=True)
        return 0
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
