"""How soon a seeded standby's first batch ends in a warm spare, with and without the stage's
plan warmed up first (spark_runtime/spare_plans.py).

    python -m bench.dataplane.first_batch [--topology wordcount] [--runs 2]

First a primary of the topology's fused stage runs for `--prepare` seconds at 50 entries/s and
leaves its checkpoint. Then, per run and alternating, a fresh process (its own JVM) does what a
warm spare does (a session and spark_runtime.spare.warm_up), with the `plan` variant also
warming the stage's plan as published by a controller (spark_runtime.spare_plans), and starts
the stage as a standby seeded from that checkpoint, behind by a few hundred new entries, as a
new standby is after a promotion. Measured: the seconds from the standby's query start to the
end of its first batch, and Spark's durations of that batch.

Prints the table and writes it to docs/RESULTS.md ("Data plane", "A spare's first batch
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

from bench.dataplane.util import run_variant_child, write_result
from spark_runtime import generators, keys
from spark_runtime.checkpoint_seed import seed_checkpoint
from spark_runtime.config import build_session
from spark_runtime.jobdef import resolve_topology
from spark_runtime.redis_client import connect
from spark_runtime.runtime import StageRuntime
from spark_runtime.spare import warm_up
from spark_runtime.spare_plans import publish_plans, stage_plans, warm_up_plans
from spark_runtime.topology import stage_spec

log = logging.getLogger("bench.dataplane.first_batch")

COMMAND = "python -m bench.dataplane.first_batch"
VARIANTS = {
    "spare": "a warm spare (session, spark_runtime.spare.warm_up)",
    "plan": "and the stage's plan warmed up (spark_runtime.spare_plans)",
}
JOB = "bench-first-batch"
ROOT = os.path.join("var", "bench", JOB)
PRIMARY_CHECKPOINT = os.path.join(ROOT, "primary")
# New input behind the seeded checkpoint: a paced standby's checkpoint is up to 6 s behind.
BEHIND_ENTRIES = 300


def run_stage(spark, client, redis_url, topology_name, job, checkpoint, role, feed_s=0):
    """Run the topology's fused stage as `role` until its first batch with input ended (and,
    fed for `feed_s` seconds, until then); returns that batch's end (seconds after the query
    started) and Spark's durations."""
    topology = resolve_topology(topology_name)
    operators = [op.name for op in topology.operators]
    stage = stage_spec(topology, "all", operators, job=job)
    runtime = StageRuntime(
        spark, client, job, topology, stage, role, redis_url, checkpoint,
        trigger_seconds=topology.trigger_s,
    )  # fmt: skip
    stop = threading.Event()
    if feed_s:
        threading.Thread(
            target=generators.generate,
            args=(client, job, topology_name),
            kwargs={"rate": 50, "duration": feed_s, "stop": stop.is_set, "resume": True},
            daemon=True,
        ).start()
    started = time.monotonic()
    runtime.start()
    (query,) = runtime.queries
    first = None
    try:
        while first is None or time.monotonic() - started < feed_s:
            progress = query.lastProgress
            if first is None and progress is not None and progress["numInputRows"] > 0:
                first = (time.monotonic() - started, dict(progress["durationMs"]))
            time.sleep(0.02)
    finally:
        stop.set()
        runtime.stop()
    return first


def run_variant(args) -> dict:
    """In this process: build a spare's session and warm-up, then measure the seeded standby."""
    client = connect(args.redis_url)
    spark = build_session(f"{JOB}-{args.variant}")
    if args.variant == "prepare":
        keys.delete_job_keys(client, JOB)
        shutil.rmtree(ROOT, ignore_errors=True)
        run_stage(
            spark, client, args.redis_url, args.topology, JOB, PRIMARY_CHECKPOINT, "primary",
            feed_s=args.prepare,
        )  # fmt: skip
        spark.stop()
        return {}
    never = threading.Event()
    warm_up(spark, client, args.redis_url, keys.spare_warmup_stream("bench", JOB), never)
    warmed = []
    if args.variant == "plan":
        operators = [op.name for op in resolve_topology(args.topology).operators]
        publish_plans(client, JOB, stage_plans(args.topology, {"all": operators}))
        try:
            warmed = warm_up_plans(spark, client, args.redis_url, JOB, never)
        finally:
            client.hdel(keys.spare_plans(), JOB)
    behind = client.xlen(keys.input_stream(JOB)) + BEHIND_ENTRIES
    generators.generate(client, JOB, args.topology, count=behind, rate=10_000, resume=True)
    standby = os.path.join(ROOT, f"standby-{args.variant}-{int(time.time() * 1000)}")
    seed_checkpoint(PRIMARY_CHECKPOINT, standby, 1)
    try:
        first_s, durations = run_stage(
            spark, client, args.redis_url, args.topology, JOB, standby, "standby"
        )
    finally:
        shutil.rmtree(standby, ignore_errors=True)
        spark.stop()
    return {"variant": args.variant, "first_batch_s": first_s, "durations": durations,
            "warmed": warmed}  # fmt: skip


def measure(args, variant: str) -> dict:
    """Run `variant` in a child process (its own JVM); its result."""
    options = ("topology", "prepare", "redis_url")
    return run_variant_child("bench.dataplane.first_batch", variant, args, options)


def table(args, results: list[dict]) -> str:
    """The RESULTS.md subsection."""
    lines = [
        f"Command: `{COMMAND} --topology {args.topology} --runs {args.runs}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores). A seeded standby of the "
        f"topology's fused stage, {BEHIND_ENTRIES} entries behind its checkpoint, started in a "
        "fresh process that did what a warm spare does first; runs alternate. First batch: "
        "seconds from the query's start to the end of its first batch with input; the batch's "
        "planning and addBatch ms are Spark's.",
        "",
        "| warm-up | first batch s (runs) | median | planning ms | addBatch ms |",
        "|---|---|---|---|---|",
    ]
    for variant, label in VARIANTS.items():
        rows = [r for r in results if r["variant"] == variant]
        firsts = [r["first_batch_s"] for r in rows]
        planning = statistics.median(r["durations"].get("queryPlanning", 0) for r in rows)
        add = statistics.median(r["durations"].get("addBatch", 0) for r in rows)
        lines.append(
            f"| {label} | {', '.join(f'{s:.2f}' for s in firsts)} | "
            f"{statistics.median(firsts):.2f} | {planning:.0f} | {add:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Prepare the checkpoint, measure both variants `--runs` times, report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--topology", default="wordcount")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--prepare", type=float, default=30, help="seconds the primary runs")
    parser.add_argument("--variant", choices=["prepare", *VARIANTS], help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.variant:
        print(json.dumps(run_variant(args)))
        return 0
    steps = 1 + args.runs * len(VARIANTS)
    log.info("[1/%d] a primary for %g s, for its checkpoint", steps, args.prepare)
    measure(args, "prepare")
    results = []
    for run in range(args.runs):
        for offset, variant in enumerate(VARIANTS):
            step = 2 + run * len(VARIANTS) + offset
            log.info("[%d/%d] run %d: %s", step, steps, run + 1, variant)
            result = measure(args, variant)
            log.info("first batch after %.2f s", result["first_batch_s"])
            results.append(result)
    body = table(args, results)
    print(body)
    if not args.no_write:
        write_result(f"A spare's first batch ({args.topology})", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
