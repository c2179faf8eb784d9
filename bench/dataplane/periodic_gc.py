"""A stage JVM's memory and batch times against the interval of Spark's periodic collection.

    python -m bench.dataplane.periodic_gc [--minutes 12] [--intervals 30min,5min] [--sample 30]
        [--extra-jvm-options "-Xms64m" ...]

Why: in the hour soak of 2026-11-30 a primary's JVM grew 663 -> 789 MB between its 10th and
27th minute. Its old generation was full of per-batch metrics and accumulators that Spark's
ContextCleaner frees only once a full collection has found them unreachable, and with the
serial collector a full collection comes when the old generation is full (the heap grows
instead, while it may) or when the cleaner forces one: every
`spark.cleaner.periodicGC.interval` (30 min by default). A shorter interval frees them sooner,
at the cost of a full-collection pause each time.

`--extra-jvm-options` adds a run at the first interval with these JVM options after Backstop's
(e.g. a smaller initial heap, which the collector grows to what the query needs: RSS counts the
heap pages the JVM has touched, and a large heap is touched slowly, over most of an hour).

Each setting runs, in a process of its own and all at once (the machine's noise falls on each
alike), the same small query a stage runs: a rate source at 20 rows/s, a Python UDF (as a
stage's Python data source, it takes every batch through a Python worker), a count by key, the
noop sink, at a 0.2 s trigger, under Backstop's session settings and JVM options. Every
`sample` seconds the driver JVM's RSS is read (no collection forced); each process logs its
collections (`-Xlog:gc`) and its batches' durations. Prints the figures and writes them to
docs/RESULTS.md ("Data plane", "Periodic collection").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.dataplane.driver_memory import driver_jvm
from bench.dataplane.util import write_result
from spark_runtime.config import DEFAULT_MASTER, JVM_OPTIONS_ENV, build_session, jvm_options
from spark_runtime.progress import percentiles

COMMAND = "python -m bench.dataplane.periodic_gc"
# A unified-logging line of a pause, e.g. "[12.345s][info][gc] GC(7) Pause Full (System.gc())
# 80M->41M(200M) 93.456ms".
PAUSE = re.compile(r"GC\(\d+\) Pause (Young|Full) .* ([\d.]+)ms$")


def run_query(interval: str, trigger_s: float, minutes: float) -> None:
    """The measured process: the query runs for `minutes`, then prints its batches' durations
    (ms, JSON) and exits."""
    from pyspark.sql.functions import col, udf

    spark = build_session("periodic-gc", {"spark.cleaner.periodicGC.interval": interval})
    checkpoint = tempfile.mkdtemp(prefix="backstop-periodic-gc-")
    key_of = udf(lambda value: value % 10, "long")
    counts = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .load()
        .groupBy(key_of(col("value")).alias("key"))
        .count()
    )
    query = (
        counts.writeStream.format("noop")
        .outputMode("update")
        .trigger(processingTime=f"{int(trigger_s * 1000)} milliseconds")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    durations: dict[int, int] = {}
    deadline = time.monotonic() + minutes * 60
    while time.monotonic() < deadline:
        progress = query.lastProgress
        if progress:
            durations[progress["batchId"]] = progress["durationMs"]["triggerExecution"]
        time.sleep(0.1)
    query.stop()
    spark.stop()
    shutil.rmtree(checkpoint, ignore_errors=True)
    print(json.dumps(list(durations.values())), flush=True)


def pauses(gc_log: Path) -> dict:
    """Count and longest pause of each kind in a JVM's GC log."""
    found: dict[str, list[float]] = {"Young": [], "Full": []}
    for line in gc_log.read_text().splitlines():
        match = PAUSE.search(line)
        if match:
            found[match.group(1)].append(float(match.group(2)))
    return {kind: (len(ms), max(ms, default=0.0)) for kind, ms in found.items()}


def variants(args) -> list[tuple[str, str]]:
    """The settings to run side by side: (periodic collection interval, extra JVM options)."""
    extras = [(args.intervals[0], extra) for extra in args.extra_jvm_options or ()]
    return [(interval, "") for interval in args.intervals] + extras


def label(interval: str, extra: str) -> str:
    return f"every {interval}" + (f", {extra}" if extra else "")


def start(number: int, interval: str, extra: str, args, log_dir: Path) -> dict:
    """Start the query with `interval` (and `extra` JVM options) in a child process logging its
    collections and writing its batches' durations to a file of its own."""
    gc_log = log_dir / f"gc-{number}.log"
    out = log_dir / f"out-{number}.txt"
    env = dict(os.environ)
    env[JVM_OPTIONS_ENV] = f"{jvm_options()} {extra} -Xlog:gc:file={gc_log}"
    with out.open("w") as stdout:
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.dataplane.periodic_gc", "--child", interval,
             "--trigger", str(args.trigger), "--minutes", str(args.minutes)],
            stdout=stdout, text=True, env=env,
        )  # fmt: skip
    return {"label": label(interval, extra), "child": child, "gc_log": gc_log, "out": out,
            "rss": []}  # fmt: skip


def finish(run: dict) -> None:
    """Read what a finished child wrote: its batches' durations and its collections."""
    code = run["child"].wait(timeout=120)
    lines = run["out"].read_text().strip().splitlines()
    if code != 0 or not lines:
        raise SystemExit(f"{run['label']}: the query's process failed (exit {code})")
    run["durations"] = json.loads(lines[-1])
    run["pauses"] = pauses(run["gc_log"])


def sample_side_by_side(runs: list[dict], every_s: float, until_minute: float, sample) -> None:
    """Find each run's driver JVM (`run["jvm"]`), then every `every_s` seconds call
    `sample(run, minute)` for each run whose child still runs, before `until_minute`, until every
    child has ended. Shared with bench.dataplane.native_memory."""
    for run in runs:
        run["jvm"] = driver_jvm(run["child"].pid)
    started = time.monotonic()
    while any(run["child"].poll() is None for run in runs):
        time.sleep(every_s)
        minute = (time.monotonic() - started) / 60
        for run in runs:
            if run["child"].poll() is None and minute < until_minute:
                sample(run, minute)


def end_children(runs: list[dict]) -> None:
    """Kill every run's child still running: a failed measurement leaves no query behind it
    (its JVM ends with it)."""
    for run in runs:
        if run["child"].poll() is None:
            run["child"].kill()
            run["child"].wait()


def sample_rss(run: dict, minute: float) -> None:
    """One sample of a running setting: its driver's RSS (no collection forced)."""
    rss = run["jvm"].memory_info().rss / 2**20
    run["rss"].append((minute, rss))
    print(f"  {run['label']}: {minute:4.1f} min RSS {rss:5.0f} MB", flush=True)


def measure(args) -> list[dict]:
    """Run every setting at once and sample each driver's RSS until they finish."""
    log_dir = Path(tempfile.mkdtemp(prefix="backstop-periodic-gc-logs-"))
    runs: list[dict] = []
    try:
        for number, (interval, extra) in enumerate(variants(args)):
            runs.append(start(number, interval, extra, args, log_dir))
        sample_side_by_side(runs, args.sample, args.minutes - 0.1, sample_rss)
        for run in runs:
            finish(run)
    finally:
        end_children(runs)
        shutil.rmtree(log_dir, ignore_errors=True)
    return runs


def sample_at(samples: list[tuple], minute: float) -> tuple:
    """The first sample (minute first) at or after `minute` (the last one if none)."""
    return next((s for s in samples if s[0] >= minute), samples[-1])


def rss_at(samples: list[tuple[float, float]], minute: float) -> float:
    """RSS of the first sample at or after `minute` (the last one if none)."""
    return sample_at(samples, minute)[1]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=12.0, help="how long each query runs")
    parser.add_argument(
        "--intervals", type=lambda text: text.split(","), default=["30min", "5min"],
        help="values of spark.cleaner.periodicGC.interval, run side by side",
    )  # fmt: skip
    parser.add_argument(
        "--extra-jvm-options", action="append", metavar="OPTIONS",
        help="also run the first interval with these JVM options after Backstop's (repeatable)",
    )  # fmt: skip
    parser.add_argument("--trigger", type=float, default=0.2, help="trigger interval, s")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/RESULTS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # the measured process
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        run_query(args.child, args.trigger, args.minutes)
        return 0
    settings = [label(*variant) for variant in variants(args)]
    print(f"{'; '.join(settings)} side by side: {args.minutes:g} min at a {args.trigger:g} s "
          "trigger", flush=True)  # fmt: skip
    runs = measure(args)
    extras = "".join(f' --extra-jvm-options="{extra}"' for extra in args.extra_jvm_options or ())
    marks = [minute for minute in (2, 5, 10, 20, 30, 45) if minute < args.minutes]
    lines = [
        f"Command: `{COMMAND} --minutes {args.minutes:g} --intervals {','.join(args.intervals)}"
        f"{extras} --sample {args.sample:g}` ({time.strftime('%Y-%m-%d %H:%M')}, "
        f"{os.cpu_count()} cores, {DEFAULT_MASTER}). A rate source at 20 rows/s through a Python "
        f"UDF, counted by key into the noop sink at a {args.trigger:g} s trigger, Backstop's "
        "session settings and JVM options; one process per setting (the interval of "
        "`spark.cleaner.periodicGC.interval`, and any JVM options added), all at once. RSS of "
        "the driver JVM (no collection forced), its collections from its GC log, and its "
        "batches' durations.",
        "",
        f"| setting | batches | RSS MB at {' / '.join(str(m) for m in marks)} min / last "
        "| full collections (longest ms) | young (longest ms) | batch p50 / p99 / max ms |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        if not run["rss"] or not run["durations"]:
            raise SystemExit(f"{run['label']}: nothing measured (--minutes too short?)")
        rss = " / ".join(f"{rss_at(run['rss'], m):.0f}" for m in marks)
        full, young = run["pauses"]["Full"], run["pauses"]["Young"]
        durations = run["durations"]
        lines.append(
            f"| {run['label']} | {len(durations)} | {rss} / {run['rss'][-1][1]:.0f} "
            f"| {full[0]} ({full[1]:.0f}) | {young[0]} ({young[1]:.0f}) "
            f"| {statistics.median(durations):.0f} / {percentiles(durations, (99,))['p99']:.0f} "
            f"/ {max(durations)} |"
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result("Initial heap" if args.extra_jvm_options else "Periodic collection", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
