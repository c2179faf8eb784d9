"""Driver memory over a stage's life: what Spark's status store keeps of every micro-batch.

    python -m bench.dataplane.driver_memory [--minutes 4] [--trigger 0.2] [--sample 30]

Why: in the hour soak, the primaries' RSS grew 12% between minute 10 and the end
(docs/RESULTS.md, "Soak"). A Spark driver records every job, stage, task and SQL execution in
its in-memory status store (for the UI and the status API, which Backstop does not use) and
forgets the oldest only past `spark.ui.retainedJobs`, `retainedStages`, `retainedTasks` and
`spark.sql.ui.retainedExecutions` (1000, 1000, 100000, 1000 by default). A stage runs a few
jobs per micro-batch, one every 2-3 s with light input: the store grows for most of an hour
before it stops. Backstop keeps few (`config.SPARK_CONF`).

Each setting runs, in a process of its own, the same small stateful query (a rate source, a
count by key, the noop sink) at a fast trigger under Backstop's session settings, one with
Spark's retention defaults and one with Backstop's; every `sample` seconds the driver JVM's live
heap (its tenured generation after a full collection: `jcmd GC.run`, then `GC.heap_info`) and
its RSS are read. The two run one after the other. Prints the figures and writes them to
docs/RESULTS.md ("Data plane", "Driver memory over time").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import time

import psutil
from pyspark.sql.functions import col

from bench.dataplane.util import write_result
from spark_runtime.config import DEFAULT_MASTER, SPARK_CONF, build_session

COMMAND = "python -m bench.dataplane.driver_memory"
# Spark's own defaults for what Backstop sets in SPARK_CONF (docs of Spark's configuration).
RETENTION_DEFAULTS = {
    "spark.ui.retainedJobs": "1000",
    "spark.ui.retainedStages": "1000",
    "spark.ui.retainedTasks": "100000",
    "spark.sql.ui.retainedExecutions": "1000",
}
SETTINGS = (("Spark's defaults", RETENTION_DEFAULTS), ("Backstop's", {}))
TENURED_USED = re.compile(r"tenured generation\s+total \d+K, used (\d+)K")
DRIVER_MAIN_CLASS = "org.apache.spark.deploy.SparkSubmit"
# The short-lived JVM that computes the driver's command line names SparkSubmit as an argument.
LAUNCHER_MAIN_CLASS = "org.apache.spark.launcher.Main"


def run_query(retention: dict, trigger_s: float, minutes: float) -> None:
    """The measured process: the query runs for `minutes`, then the process exits."""
    spark = build_session("driver-memory", retention)
    counts = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .load()
        .groupBy((col("value") % 10).alias("key"))
        .count()
    )
    query = (
        counts.writeStream.format("noop")
        .outputMode("update")
        .trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds")
        .option("checkpointLocation", f"/tmp/backstop-driver-memory-{os.getpid()}")
        .start()
    )
    time.sleep(minutes * 60)
    print(f"batches {query.lastProgress['batchId'] if query.lastProgress else 0}", flush=True)
    query.stop()
    spark.stop()


def driver_jvm(pid: int, timeout_s: float = 120) -> psutil.Process:
    """The driver JVM under process `pid` (not the launcher JVM that computes its command
    line and exits), once it started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                cmdline = proc.cmdline()
                if (
                    proc.name() == "java"
                    and DRIVER_MAIN_CLASS in cmdline
                    and LAUNCHER_MAIN_CLASS not in cmdline
                ):
                    return proc
        time.sleep(0.5)
    raise TimeoutError(f"no JVM under pid {pid} after {timeout_s} s")


def heap_after_gc_mb(jvm_pid: int) -> float:
    """Used heap of JVM `jvm_pid` right after a full collection, in MiB."""
    subprocess.run(["jcmd", str(jvm_pid), "GC.run"], capture_output=True, check=True, timeout=60)
    info = subprocess.run(
        ["jcmd", str(jvm_pid), "GC.heap_info"], capture_output=True, text=True, timeout=60
    ).stdout
    # Serial collector: a full collection leaves what lives in the tenured generation; the new
    # generation holds what the batches allocated since (noise at a fast trigger).
    match = TENURED_USED.search(info)
    if match is None:
        raise RuntimeError(f"no tenured generation in the heap info of {jvm_pid}:\n{info}")
    return int(match.group(1)) / 1024


def measure(label: str, retention: dict, args) -> dict:
    """Run the query with `retention` in a child process and sample its driver's memory."""
    overrides = ",".join(f"{k}={v}" for k, v in retention.items())
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.dataplane.driver_memory", "--child", overrides,
         "--trigger", str(args.trigger), "--minutes", str(args.minutes)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    jvm = driver_jvm(child.pid)
    started = time.monotonic()
    samples = []
    try:
        while child.poll() is None and time.monotonic() - started < args.minutes * 60 - 5:
            time.sleep(args.sample)
            heap = heap_after_gc_mb(jvm.pid)
            rss = jvm.memory_info().rss / 2**20
            minute = (time.monotonic() - started) / 60
            samples.append((minute, heap, rss))
            print(f"  {label}: {minute:4.1f} min live heap {heap:6.1f} MB, RSS {rss:5.0f} MB",
                  flush=True)  # fmt: skip
    finally:
        out, _ = child.communicate(timeout=args.minutes * 60 + 120)
    batches = int(out.split()[-1]) if out.strip() else 0
    return {"label": label, "samples": samples, "batches": batches}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="how long each setting runs")
    parser.add_argument("--trigger", type=float, default=0.2, help="trigger interval, s")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/RESULTS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the measured process
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        retention = dict(kv.split("=", 1) for kv in args.child.split(",") if kv)
        run_query(retention, args.trigger, args.minutes)
        return 0
    rows = []
    for label, retention in SETTINGS:
        print(f"{label}: {args.minutes:g} min at a {args.trigger:g} s trigger", flush=True)
        rows.append(measure(label, retention, args))
    kept = ", ".join(f"`{k}` {SPARK_CONF[k]}" for k in RETENTION_DEFAULTS)
    lines = [
        f"Command: `{COMMAND} --minutes {args.minutes:g} --trigger {args.trigger:g} --sample "
        f"{args.sample:g}` ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"{DEFAULT_MASTER}). A rate source at 20 rows/s counted by key into the noop sink, "
        "Backstop's session settings, once with Spark's retention of finished jobs, stages, "
        f"tasks and SQL executions (1000, 1000, 100000, 1000) and once with Backstop's ({kept}); "
        "the driver JVM's live heap (its tenured generation right after a full collection) and "
        "its RSS, per sample.",
        "",
        "| retention | batches | live heap, MB, per sample | RSS MB, first → last |",
        "|---|---|---|---|",
    ]
    for row in rows:
        if not row["samples"]:
            raise SystemExit(f"{row['label']}: no sample taken (--minutes too short?)")
        heaps = ", ".join(f"{heap:.0f}" for _m, heap, _r in row["samples"])
        rss = row["samples"][0][2], row["samples"][-1][2]
        lines.append(
            f"| {row['label']} | {row['batches']} | {heaps} | {rss[0]:.0f} → {rss[1]:.0f} |"
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result("Driver memory over time", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
