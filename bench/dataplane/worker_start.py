"""Measure what a fresh Spark Python worker costs before it can connect back to its JVM.

    python -m bench.dataplane.worker_start [--runs 5] [--busy 0]

Spark gives the Python process of a streaming Python data source a fixed 10 s to connect back
when a query starts. Before it can, that process imports its module
(`pyspark.sql.streaming.python_streaming_source_runner`). This starts that import the way Spark
does, with PySpark's and py4j's bundled zips first on PYTHONPATH, once through this interpreter
(what Spark ran before) and once through `backstop-python-worker` (spark_runtime/python_worker.py),
`--runs` times each, alternating; `--busy N` keeps N CPU-bound processes spinning meanwhile, each
in a session of its own like a stage process, to show the wall time on saturated cores. Prints
the median CPU and wall seconds of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import time

from spark_runtime.config import WORKER_PYTHON_SCRIPT, worker_python
from spark_runtime.python_worker import BUNDLED_LIB

SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def spark_worker_pythonpath() -> str:
    """PYTHONPATH as Spark sets it for a worker of the installed PySpark: its zips first."""
    lib = os.path.join(sysconfig.get_paths()["purelib"], BUNDLED_LIB)
    zips = [os.path.join(lib, "pyspark.zip")]
    zips += sorted(os.path.join(lib, name) for name in os.listdir(lib) if name.startswith("py4j-"))
    return os.pathsep.join(zips)


def import_cost(python: str) -> tuple[float, float]:
    """CPU and wall seconds of `python -c "import SOURCE_RUNNER"` with Spark's worker path."""
    env = {**os.environ, "PYTHONPATH": spark_worker_pythonpath()}
    started = time.monotonic()
    proc = subprocess.Popen([python, "-c", f"import {SOURCE_RUNNER}"], env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{python} could not import {SOURCE_RUNNER}")
    return usage.ru_utime + usage.ru_stime, wall


def start_spinners(count: int) -> list[subprocess.Popen]:
    """`count` CPU-bound processes, each in a session of its own."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(count)
    ]


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the median import cost of a fresh worker, both ways."""
    parser = argparse.ArgumentParser(prog="python -m bench.dataplane.worker_start")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes meanwhile")
    args = parser.parse_args(argv)
    wrapper = worker_python()
    if os.path.basename(wrapper) != WORKER_PYTHON_SCRIPT:
        print(f"{WORKER_PYTHON_SCRIPT} is not installed beside {sys.executable}: pip install -e .")
        return 2
    ways = {
        "this interpreter (PySpark from Spark's zip)": sys.executable,
        WORKER_PYTHON_SCRIPT: wrapper,
    }
    costs: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    spinners = start_spinners(args.busy)
    try:
        for run in range(args.runs):
            for name, python in ways.items():
                costs[name].append(import_cost(python))
            print(f"run {run + 1}/{args.runs} done", file=sys.stderr, flush=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    print(
        f"Import of {SOURCE_RUNNER} by a fresh worker process, median of {args.runs} "
        f"({args.busy} CPU-bound processes beside it)"
    )
    print("| worker interpreter | CPU s | wall s |")
    print("|---|---|---|")
    for name, runs in costs.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"| {name} | {cpu:.2f} | {wall:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
