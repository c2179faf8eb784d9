"""Where a micro-batch's CPU goes: a topology's fused stage under each batch-cost change.

    python -m bench.dataplane.batch_breakdown [--topology wordcount] [--rate 50] [--trigger 0.5]

Runs the topology as one fused stage (restart-all's queries, output gate and sinks) in a child
process per variant, one variant after the other, each fed `rate` entries per second; after
`settle` seconds it samples for `measure` seconds the CPU of the child's JVM, of its driver
Python and of Spark's Python workers (the source's planner and readers), and Spark's own
per-batch durations (`durationMs` of the progress events: planning, the offset log's write
`walCommit`, `addBatch` (the job, the state store and the sink), the commit log's write
`commitOffsets`, the whole trigger). Variants, each adding one change to the one before:

- `pyspark`: what Spark and PySpark do by default: PySpark's listener bridge, and checkpoint
  files through Hadoop's FileContext API;
- `json-progress`: progress events cross to Python as JSON (spark_runtime/listener.py);
- `filesystem-checkpoints`: checkpoint files through Hadoop's FileSystem API
  (spark_runtime/config.py);
- `one-partition`: one shuffle (state) partition instead of two.

Prints the table and writes it to docs/RESULTS.md ("Data plane", "Batch cost: where it goes
(TOPOLOGY)").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import threading
import time

import psutil

from bench.dataplane.util import run_variant_child, write_result
from spark_runtime import generators, keys
from spark_runtime.activity import process_cpu_s
from spark_runtime.config import build_session
from spark_runtime.jobdef import resolve_topology
from spark_runtime.listener import JsonProgressListener
from spark_runtime.redis_client import connect
from spark_runtime.runtime import StageRuntime
from spark_runtime.topology import stage_spec

log = logging.getLogger("bench.dataplane.batch_breakdown")

COMMAND = "python -m bench.dataplane.batch_breakdown"
FILE_CONTEXT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"
)
CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"

# name: (what it changes, JSON progress listener, extra Spark settings)
VARIANTS = {
    "pyspark": (
        "PySpark's listener bridge, FileContext checkpoints (Spark's defaults)",
        False,
        {CHECKPOINT_MANAGER: FILE_CONTEXT_MANAGER},
    ),
    "json-progress": (
        "and progress events as JSON",
        True,
        {CHECKPOINT_MANAGER: FILE_CONTEXT_MANAGER},
    ),
    "filesystem-checkpoints": ("and FileSystem checkpoints (Backstop's configuration)", True, {}),
    "one-partition": (
        "and one state partition instead of two",
        True,
        {"spark.sql.shuffle.partitions": "1"},
    ),
}
DURATIONS = ("queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")


def process_kind(proc, me: int, jvm: int | None) -> str:
    """`driver` (this process), `jvm` or `python workers` (the JVM's children)."""
    if proc.pid == me:
        return "driver"
    return "jvm" if proc.pid == jvm else "python workers"


def cpu_by_kind() -> dict[str, float]:
    """CPU seconds so far of this process and its descendants (ended ones in their parent's),
    by process_kind."""
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    jvm = next((p.pid for p in procs if p.name() == "java"), None)
    used: dict[str, float] = {}
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue  # a child that just ended
        kind = process_kind(proc, me.pid, jvm)
        used[kind] = used.get(kind, 0.0) + process_cpu_s(times)
    return used


def run_variant(args) -> dict:
    """Run the fused stage under `args.variant` in this process and measure it."""
    _, json_progress, conf = VARIANTS[args.variant]
    client = connect(args.redis_url)
    job = f"bench-bd-{args.variant}-{int(time.time())}"
    checkpoint = os.path.join("var", "bench", job)
    spark = build_session(job, conf)
    topology = resolve_topology(args.topology)
    stage = stage_spec(topology, "all", [op.name for op in topology.operators], job=job)
    runtime = StageRuntime(
        spark,
        client,
        job,
        topology,
        stage,
        "primary",
        args.redis_url,
        checkpoint,
        trigger_seconds=args.trigger,
    )
    batches: list[dict] = []
    spark.streams.addListener(recorder(json_progress, runtime, batches))
    stop = threading.Event()
    feeder = threading.Thread(
        target=generators.generate,
        args=(client, job, args.topology),
        kwargs={"rate": args.rate, "seed": 0, "stop": stop.is_set},
        daemon=True,
    )
    try:
        runtime.start()
        feeder.start()
        time.sleep(args.settle)
        before, started, first = cpu_by_kind(), time.time(), len(batches)
        time.sleep(args.measure)
        after, elapsed = cpu_by_kind(), time.time() - started
        measured = batches[first:]
    finally:
        stop.set()
        runtime.stop()
        spark.stop()
        keys.delete_job_keys(client, job)
        shutil.rmtree(checkpoint, ignore_errors=True)
    cpu = {kind: 100 * (after[kind] - before.get(kind, 0.0)) / elapsed for kind in after}
    total_s = sum(after.values()) - sum(before.values())
    latencies = [b["latency_p50"] for b in measured if b["latency_p50"] is not None]
    return {
        "variant": args.variant,
        "cpu_pct": cpu,
        "cpu_total_pct": sum(cpu.values()),
        "batches": len(measured),
        "cpu_s_per_batch": total_s / max(1, len(measured)),
        "duration_ms": {
            name: statistics.median(b["durations"].get(name, 0) for b in measured)
            for name in DURATIONS
        }
        if measured
        else {},
        "latency_p50_ms": 1000 * statistics.median(latencies) if latencies else None,
    }


def recorder(json_progress: bool, runtime, batches: list):
    """A listener that keeps each batch's durations and output latency (median) in `batches`,
    through the JSON bridge (spark_runtime/listener.py) or PySpark's own."""
    from pyspark.sql.streaming import StreamingQueryListener

    base = JsonProgressListener if json_progress else StreamingQueryListener

    class Recorder(base):
        def onQueryStarted(self, event):
            return None

        def onQueryIdle(self, event):
            return None

        def onQueryTerminated(self, event):
            return None

        def onQueryProgress(self, event):
            progress = event.progress
            stats = runtime.gate.batch_stats.get(f"{progress.name}:{progress.batchId}", {})
            batches.append(
                {
                    "durations": dict(progress.durationMs),
                    "latency_p50": stats.get("latency", {}).get("p50"),
                }
            )

    return Recorder()


def measure(args, variant: str) -> dict:
    """Run one variant in a child process (its own JVM, JIT and Python workers)."""
    log.info(
        "%s: %s for %g s, then measuring %g s", variant, args.topology, args.settle, args.measure
    )
    options = ("topology", "rate", "trigger", "settle", "measure", "redis_url")
    result = run_variant_child("bench.dataplane.batch_breakdown", variant, args, options)
    log.info(
        "%s: %.1f%% of a core, %.3f CPU s per batch",
        variant,
        result["cpu_total_pct"],
        result["cpu_s_per_batch"],
    )
    return result


def table(args, results: list[dict]) -> str:
    """The RESULTS.md subsection."""
    lines = [
        f"Command: `{COMMAND} --topology {args.topology} --rate {args.rate:g} --trigger "
        f"{args.trigger:g} --settle {args.settle:g} --measure {args.measure:g}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores). The topology as one "
        "fused stage (restart-all's queries, output gate and sinks) in a child process per "
        "row, one after the other; CPU in percent of one core over the measured seconds, by "
        "process: the JVM, the driver's Python (with the input generator's thread), Spark's "
        "Python workers (the source's planner and readers, a state function's); durations "
        "are medians of Spark's per-batch `durationMs` (ms); latency is the median of the "
        "batches' event-time p50. Each row adds one change to the row above.",
        "",
        "| change | CPU % (JVM / driver / workers) | CPU s per batch | batches "
        "| planning / walCommit / addBatch / commitOffsets / trigger ms | latency p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        cpu = r["cpu_pct"]
        d = r["duration_ms"]
        latency = "-" if r["latency_p50_ms"] is None else f"{r['latency_p50_ms']:.0f}"
        lines.append(
            f"| {VARIANTS[r['variant']][0]} | {r['cpu_total_pct']:.1f} ({cpu.get('jvm', 0):.1f} / "
            f"{cpu.get('driver', 0):.1f} / {cpu.get('python workers', 0):.1f}) "
            f"| {r['cpu_s_per_batch']:.3f} | {r['batches']} | "
            + " / ".join(f"{d.get(name, 0):.0f}" for name in DURATIONS)
            + f" | {latency} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure every variant (or, with --variant, one, printing JSON) and report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--topology", default="wordcount")
    parser.add_argument("--rate", type=float, default=50, help="input entries per second")
    parser.add_argument("--trigger", type=float, default=0.5, help="seconds between batches")
    parser.add_argument("--settle", type=float, default=30, help="seconds before measuring")
    parser.add_argument("--measure", type=float, default=60, help="seconds measured")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated variants to run, in this order (default: all)",
    )
    parser.add_argument("--variant", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.variant:
        print(json.dumps(run_variant(args)))
        return 0
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or not chosen:
        parser.error(
            f"--variants: unknown {', '.join(unknown) or 'none given'}; one of "
            f"{', '.join(VARIANTS)}"
        )
    results = []
    for index, variant in enumerate(chosen, start=1):
        log.info("[%d/%d] %s", index, len(chosen), variant)
        results.append(measure(args, variant))
    body = table(args, results)
    print(body)
    if not args.no_write:
        write_result(f"Batch cost: where it goes ({args.topology})", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
