"""Batch cost: the CPU a topology's plain query uses when it batches every 1, 2, 3 or 6 s.

    python -m bench.dataplane.batch_cost [--topology topn] [--every 1,2,3,6] [--rate 50]

Why: a caught-up standby reads new input only every `STANDBY_BATCH_EVERY_S` rather than on
every trigger (docs/DATA_PLANE.md, "Batch pace of a caught-up standby"), on the view that at
these input rates a micro-batch's cost is nearly all fixed. This measures it: the topology runs
as one fused stage (restart-all's) under the local runner, once per batch interval, fed `rate`
entries per second; after `settle` seconds, the CPU time of the stage's process tree (driver,
JVM, Python workers) is sampled over `measure` seconds. Prints the figures and writes them to
docs/RESULTS.md ("Data plane", "Batch cost").
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

from bench.dataplane.util import fused_stage, tree_cpu_s, write_result
from spark_runtime.progress import read_progress
from spark_runtime.redis_client import connect

log = logging.getLogger("bench.dataplane.batch_cost")

COMMAND = "python -m bench.dataplane.batch_cost"


def measure(client, redis_url: str, topology: str, every_s: float, args) -> dict:
    """Run `topology` fused with a trigger of `every_s` and return its CPU share over the
    measured window (percent of one core) and the batches it ran meanwhile."""
    job = f"bench-bc-{topology}-{every_s:g}-{int(time.time())}"
    stage = fused_stage(client, redis_url, topology, job, args.rate, trigger_seconds=every_s)
    with stage as (pid, start_feeding):
        start_feeding()
        log.info("%s every %g s: settling for %g s", topology, every_s, args.settle)
        time.sleep(args.settle)
        before, started = tree_cpu_s(pid), time.time()
        log.info("%s every %g s: measuring for %g s", topology, every_s, args.measure)
        time.sleep(args.measure)
        used, elapsed = tree_cpu_s(pid) - before, time.time() - started
        records = read_progress(client, job, started, started + elapsed)
    cpu = 100.0 * used / elapsed
    latencies = [r.latency_p50 for r in records if r.final and r.latency_p50 is not None]
    latency = statistics.median(latencies) if latencies else None
    log.info(
        "%s every %g s: %.1f%% of a core, %d progress events", topology, every_s, cpu, len(records)
    )
    return {
        "every_s": every_s,
        "cpu_pct": cpu,
        "batches": len(records),
        "seconds": elapsed,
        "latency_p50_s": latency,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure each batch interval in turn and report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--topology", default="topn")
    parser.add_argument("--every", default="1,2,3,6", help="batch intervals (seconds), in order")
    parser.add_argument("--rate", type=float, default=50, help="input entries per second")
    parser.add_argument("--settle", type=float, default=40, help="seconds before measuring")
    parser.add_argument("--measure", type=float, default=60, help="seconds measured")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    parser.add_argument(
        "--section", default="Batch cost", help="the subsection of docs/RESULTS.md to replace"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = connect(args.redis_url)
    intervals = [float(s) for s in args.every.split(",") if s.strip()]
    results = [measure(client, args.redis_url, args.topology, s, args) for s in intervals]
    lines = [
        f"Command: `{COMMAND} --topology {args.topology} --every {args.every} --rate {args.rate:g} "
        f"--settle {args.settle:g} --measure {args.measure:g}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores). The topology's plain "
        "query (one fused stage, restart-all's) under the local runner, one batch interval "
        "after the other; CPU is the stage's process tree (driver, JVM, Python workers) over "
        "the measured seconds, in percent of one core; progress events count the batches "
        "of the stage's queries; latency is the median of the final batches' event-time p50.",
        "",
        "| batch every | CPU % of a core | progress events | seconds measured | latency p50 ms |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        latency = "-" if r["latency_p50_s"] is None else f"{1000 * r['latency_p50_s']:.0f}"
        lines.append(
            f"| {r['every_s']:g} s | {r['cpu_pct']:.1f} | {r['batches']} | {r['seconds']:.0f} "
            f"| {latency} |"
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result(args.section, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
