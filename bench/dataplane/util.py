"""Helpers shared by the data-plane benchmarks: a local runner, waiting for replicas, reading
progress, and their section of docs/RESULTS.md (through bench/results.py). No Django imports."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from bench.results import write_subsection
from spark_runtime import generators, keys
from spark_runtime.activity import tree_cpu_seconds
from spark_runtime.progress import ProgressRecord, read_progress
from spark_runtime.runner import build_runner

SECTION = "## Data plane"


def bench_runner(topology: str, job: str, strategy: str, redis_url: str, client, **options):
    """A local runner (spark_runtime.runner.build_runner, `options` passed on) for a benchmark
    job, with its checkpoints and logs under var/bench/{job}; returns (runner, that directory)."""
    root = os.path.join("var", "bench", job)
    runner = build_runner(
        topology,
        job,
        strategy,
        redis_url,
        client,
        checkpoint_root=os.path.join(root, "checkpoints"),
        log_dir=os.path.join(root, "logs"),
        **options,
    )
    return runner, root


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) used so far by process `pid` and its live descendants
    (activity.tree_cpu_seconds); a benchmark's stage that ended meanwhile is an error."""
    used = tree_cpu_seconds(pid)
    if used is None:
        raise RuntimeError(f"process {pid} ended while it was measured")
    return used[0]


@contextlib.contextmanager
def fused_stage(
    client, redis_url: str, topology: str, job: str, rate: float, **options
) -> Iterator[tuple[int, Callable[[], None]]]:
    """Run `topology` as one fused stage (restart-all's) under a local runner until the block
    ends, then stop it and delete its keys and files. Yields, once the stage runs, its process
    id and a function that starts feeding it `rate` input entries per second."""
    runner, root = bench_runner(topology, job, "restart-all", redis_url, client, **options)
    stop, feeding = threading.Event(), threading.Event()
    supervise = threading.Thread(target=runner.run, kwargs={"stop": stop.is_set})
    feeder = threading.Thread(
        target=generators.generate,
        args=(client, job, topology),
        kwargs={"rate": rate, "seed": 0, "stop": feeding.is_set},
    )
    try:
        runner.start()
        supervise.start()
        (replica,) = list(runner.launcher.processes)
        wait_running(client, job, [replica])
        yield runner.launcher.pid(replica), feeder.start
    finally:
        feeding.set()
        if feeder.is_alive():
            feeder.join()
        stop.set()
        if supervise.is_alive():
            supervise.join(timeout=60)
        keys.delete_job_keys(client, job)
        shutil.rmtree(root, ignore_errors=True)


def wait_running(client, job: str, replicas: list[str], timeout: float = 180) -> None:
    """Block until every replica reports state `running` in the replicas hash."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = {k: json.loads(v) for k, v in client.hgetall(keys.replicas(job)).items()}
        if all(states.get(r, {}).get("state") == "running" for r in replicas):
            return
        time.sleep(0.5)
    raise TimeoutError(f"replicas of {job} not running after {timeout} s")


def final_progress(
    client, job: str, since: float, until: float, role: str | None = "primary"
) -> list[ProgressRecord]:
    """Progress records of batches that produced final outputs, within [since, until]
    (of replicas in `role`; every role if None)."""
    return [
        r for r in read_progress(client, job, since, until) if r.final and role in (None, r.role)
    ]


def wait_steady(
    client, job: str, replicas: list[str], bound: float, timeout: float, batches: int = 5
) -> float:
    """Wait until the last `batches` final batches of every replica had latency p99 under
    `bound` seconds (the backlog of the start is worked off); returns the seconds waited."""
    started = time.time()
    while time.time() - started < timeout:
        recent = final_progress(client, job, time.time() - 30, time.time(), role=None)
        steady = True
        for replica in replicas:
            mine = [r for r in recent if r.replica == replica and r.latency_p99 is not None]
            last = mine[-batches:]
            if len(last) < batches or any(r.latency_p99 >= bound for r in last):
                steady = False
        if steady:
            return time.time() - started
        time.sleep(1)
    raise TimeoutError(f"{job} not steady (p99 < {bound} s) after {timeout} s")


def run_variant_child(module: str, variant: str, args, options: tuple[str, ...]) -> dict:
    """Run `python -m module --variant VARIANT` with `args`' `options` passed on, in a child
    process (its own JVM), and return the JSON object it printed last; RuntimeError with the
    end of its stderr if it failed or printed none."""
    command = [sys.executable, "-m", module, "--variant", variant]
    for option in options:
        command += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"variant {variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def write_result(subsection: str, body: str) -> None:
    """Replace `### {subsection}` of the "Data plane" section of docs/RESULTS.md."""
    write_subsection(SECTION, subsection, body)
