"""Replica CPU: what one replica of wordcount costs (primary, hot standby, idle warm spare)
against its input rate, with and without holding light input.

    python -m bench.dataplane.replica_cpu [--rates 0,5,20,100] [--wait 2] [--settle 10]
        [--measure 20] [--no-write]

Why: a micro-batch's CPU is nearly all fixed (docs/RESULTS.md, "Batch cost"), so a replica of a
20 lines/s job batching on every 0.5 s trigger used about half a core, and a protected job with
a standby and a spare far more than its input needs (issue 59). The policy's
`light_input_wait_s` lets a replica's sources hold light input that long before a batch reads it
(spark_runtime/redis_source.py, `hold_light_input`).

Two jobs run wordcount at once under the local runner with the active-all strategy (a primary
and a hot standby each, CPU priorities and a caught-up standby's pace as in production): one
without holding (`light_input_wait_s` 0, as before), one with `--wait`; beside them one idle warm
spare started as a node agent does. Both jobs get the same input rate, one rate after the other:
after `settle` seconds at a rate, the CPU of each replica's processes (its Python driver, its JVM,
Spark's Python workers; user and system time from /proc) is read over `measure` seconds. Prints
the table and writes it to docs/RESULTS.md ("Data plane", "Replica CPU against input rate").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import statistics
import threading
import time

import psutil

from bench.dataplane.spare_footprint import NODE, part_of, start_spare, stop_spare
from bench.dataplane.util import bench_runner, final_progress, wait_running, write_result
from spark_runtime import generators, keys
from spark_runtime.activity import process_cpu_s
from spark_runtime.config import jvm_options
from spark_runtime.progress import read_progress
from spark_runtime.redis_client import connect

log = logging.getLogger("bench.dataplane.replica_cpu")

COMMAND = "python -m bench.dataplane.replica_cpu"
TOPOLOGY = "wordcount"
PARTS = ("Python driver", "JVM", "Python workers")


def cpu_by_part(root_pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process of the replica rooted at `root_pid`, by pid, with
    the part it is (spare_footprint.part_of); processes that end meanwhile are left out."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return {}
    found = {}
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            found[proc.pid] = (part_of(proc, root_pid), process_cpu_s(proc.cpu_times()))
    return found


def cpu_used(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds each part used between two `cpu_by_part` readings (a process started in
    between counts from zero), and their total."""
    used = dict.fromkeys(PARTS, 0.0)
    for pid, (part, seconds) in after.items():
        used[part] += seconds - before.get(pid, (part, 0.0))[1]
    used["total"] = sum(used[p] for p in PARTS)
    return used


class BenchJob:
    """One wordcount job (active-all: a primary and a hot standby) under a local runner, fed
    at a rate that can change."""

    def __init__(self, client, redis_url: str, name: str, wait_s: float):
        self.client = client
        self.name = name
        self.wait_s = wait_s
        self.job = f"bench-rc-{name}-{int(time.time())}"
        self.runner, self.root = bench_runner(
            TOPOLOGY, self.job, "active-all", redis_url, client, light_input_wait_s=wait_s
        )
        self.stop_runner = threading.Event()
        self.supervise = threading.Thread(
            target=self.runner.run, kwargs={"stop": self.stop_runner.is_set}
        )
        self.feeding: threading.Event | None = None
        self.feeder: threading.Thread | None = None

    def start(self) -> None:
        """Start the replicas and wait until they run."""
        self.runner.start()
        self.supervise.start()
        wait_running(self.client, self.job, list(self.runner.launcher.processes))

    def pids(self) -> dict[str, int]:
        """Role ("primary", "standby") -> process id of the replica in it now."""
        entries = {
            r: json.loads(v) for r, v in self.client.hgetall(keys.replicas(self.job)).items()
        }
        return {
            entries[r]["role"]: self.runner.launcher.pid(r)
            for r in self.runner.launcher.processes
            if r in entries and self.runner.launcher.alive(r)
        }

    def feed(self, rate: float) -> None:
        """Stop the current feeder, then feed `rate` entries per second (0: none)."""
        if self.feeder is not None:
            self.feeding.set()
            self.feeder.join()
            self.feeder = None
        if rate <= 0:
            return
        self.feeding = threading.Event()
        self.feeder = threading.Thread(
            target=generators.generate,
            args=(self.client, self.job, TOPOLOGY),
            kwargs={
                "rate": rate,
                "seed": int(rate),
                "stop": self.feeding.is_set,
                "id_prefix": f"r{rate:g}-",
            },
        )
        self.feeder.start()

    def stop(self) -> None:
        """Stop feeding and the replicas; delete the job's keys and files."""
        self.feed(0)
        self.stop_runner.set()
        if self.supervise.is_alive():
            self.supervise.join(timeout=60)
        self.runner.shutdown()
        keys.delete_job_keys(self.client, self.job)
        shutil.rmtree(self.root, ignore_errors=True)


def spare_state(client, spare_id: str) -> str:
    """The state the spare reports (`starting` while it warms up, then `idle`)."""
    raw = client.hget(keys.spares(NODE), spare_id)
    return json.loads(raw).get("state", "?") if raw else "gone"


def measure_rate(jobs: list[BenchJob], spare, rate: float, args) -> list[dict]:
    """Feed every job `rate` entries/s, settle, and read each replica's CPU over the measured
    seconds; one row per job and role (and the spare's, `spare`: (id, process) or None)."""
    for job in jobs:
        job.feed(rate)
    log.info("%g lines/s: settling for %g s", rate, args.settle)
    time.sleep(args.settle)
    targets = [(job, role, pid) for job in jobs for role, pid in job.pids().items()]
    if spare is not None:
        targets.append((None, "spare", spare[1].pid))
    before = {(id(job), role): cpu_by_part(pid) for job, role, pid in targets}
    started = time.time()
    time.sleep(args.measure)
    elapsed = time.time() - started
    rows = []
    for job, role, pid in targets:
        used = cpu_used(before[(id(job), role)], cpu_by_part(pid))
        if job is None:
            # Where the machine is busy a spare at nice 19 may still be warming up.
            role = f"spare ({spare_state(jobs[0].client, spare[0])})"
        row = {
            "variant": job.name if job else "-",
            "wait_s": job.wait_s if job else None,
            "rate": rate,
            "role": role,
            "cores": {part: seconds / elapsed for part, seconds in used.items()},
            "seconds": elapsed,
        }
        if job is not None:
            records = [
                r
                for r in read_progress(job.client, job.job, started, started + elapsed)
                if r.role == role
            ]
            row["batches_per_min"] = 60.0 * len({(r.query, r.batch) for r in records}) / elapsed
            latencies = [
                r.latency_p50
                for r in final_progress(job.client, job.job, started, started + elapsed, role)
                if r.latency_p50 is not None
            ]
            row["latency_p50_ms"] = 1000 * statistics.median(latencies) if latencies else None
        rows.append(row)
        log.info("%g lines/s, %s %s: %.3f cores", rate, row["variant"], role, row["cores"]["total"])
    return rows


def table(rows: list[dict]) -> list[str]:
    """The markdown table of the rows."""
    lines = [
        "| input lines/s | replica | light_input_wait_s | cores (driver / JVM / workers) "
        "| batches/min | latency p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["cores"]
        wait = "-" if r["wait_s"] is None else f"{r['wait_s']:g}"
        batches = "-" if r.get("batches_per_min") is None else f"{r['batches_per_min']:.0f}"
        latency = "-" if r.get("latency_p50_ms") is None else f"{r['latency_p50_ms']:.0f}"
        lines.append(
            f"| {r['rate']:g} | {r['role']} | {wait} | **{c['total']:.3f}** "
            f"({c['Python driver']:.3f} / {c['JVM']:.3f} / {c['Python workers']:.3f}) "
            f"| {batches} | {latency} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the two jobs and the spare, measure every rate, report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--rates", default="0,5,20,100", help="input lines/s, in order")
    parser.add_argument("--wait", type=float, default=2.0, help="light_input_wait_s of 'after'")
    parser.add_argument("--settle", type=float, default=10, help="seconds before measuring")
    parser.add_argument("--measure", type=float, default=20, help="seconds measured per rate")
    parser.add_argument("--no-spare", action="store_true", help="do not measure a warm spare")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = connect(args.redis_url)
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    jobs = [
        BenchJob(client, args.redis_url, "before", 0.0),
        BenchJob(client, args.redis_url, "after", args.wait),
    ]
    spare = None
    rows: list[dict] = []
    try:
        if not args.no_spare:
            spare = start_spare(client, args.redis_url, jvm_options())
        for job in jobs:
            job.start()
        for rate in rates:
            rows += measure_rate(jobs, spare, rate, args)
    finally:
        for job in jobs:
            job.stop()
        if spare is not None:
            stop_spare(client, *spare)
    rows.sort(
        key=lambda r: (r["rate"], r["role"] != "primary", r["role"], r["variant"] != "before")
    )
    lines = [
        f"Command: `{COMMAND} --rates {args.rates} --wait {args.wait:g} --settle "
        f"{args.settle:g} --measure {args.measure:g}` ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end). Two "
        "wordcount jobs at once under the local runner (active-all: a primary and a hot standby "
        "each, CPU priorities and the caught-up standby's pace as in production), one with "
        "`light_input_wait_s` 0 (a batch on every trigger with input, as before), one with "
        f"{args.wait:g} s; and one warm spare (its state when measured in brackets: `starting` "
        "while it warms up at nice 19). Each rate after the other, both jobs fed alike; CPU in "
        "cores (CPU seconds per second) of each replica's processes over the measured seconds; "
        "batches/min counts the replica's micro-batches; latency is the median of its final "
        "batches' event-time "
        "p50.",
        "",
        *table(rows),
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result("Replica CPU against input rate", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
