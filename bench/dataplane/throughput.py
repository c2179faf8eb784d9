"""Throughput benchmark: the highest sustained input rate per topology with event-time latency
p99 under 5 s, on this machine.

    python -m bench.dataplane.throughput [--topology NAME ...] [--step 15]

Each topology runs as its stages under the local runner (local-restart: one stage process per
operator, Redis streams between them). The input rate goes up step by step; a step passes if
the highest per-batch p99 of the final stage's event-time latency (output time minus the input's
`ts`) over the step, after a settling period, stays under the bound. The figure reported is the
last passing rate. Prints the figures and writes them to docs/RESULTS.md ("Data plane").
"""

from __future__ import annotations

import argparse
import logging
import shutil
import threading
import time

from bench.dataplane.util import (
    bench_runner,
    final_progress,
    wait_running,
    wait_steady,
    write_result,
)
from spark_runtime import generators, keys
from spark_runtime.redis_client import connect
from spark_runtime.topology import PER_OPERATOR, compile_stages, get_topology

log = logging.getLogger("bench.dataplane.throughput")

COMMAND = "python -m bench.dataplane.throughput"
P99_BOUND = 5.0
# Input entries per second (wordcount: lines of ~7.5 words).
RATES = {
    "wordcount": [50, 100, 200, 400, 800, 1600],
    "topn": [1000, 2000, 4000, 8000, 16000],
    "traffic": [1000, 2000, 4000, 8000, 16000],
    "shuffle": [1000, 2000, 4000, 8000, 16000],
}


def measure(client, redis_url: str, topology: str, args) -> dict:
    """Ramp the input rate of one topology; returns the steps and the highest passing rate."""
    job = f"bench-tp-{topology}-{int(time.time())}"
    runner, root = bench_runner(
        topology,
        job,
        "local-restart",
        redis_url,
        client,
        max_records=args.max_records,
        chaining=PER_OPERATOR,
    )
    stages = [s.name for s in compile_stages(get_topology(topology), PER_OPERATOR)]
    stop = threading.Event()
    steps = []
    best = None
    supervise = threading.Thread(target=runner.run, kwargs={"stop": stop.is_set})
    try:
        runner.start()
        supervise.start()
        wait_running(client, job, [f"{s}-1" for s in stages])
        # Warm up (Python workers, first state-store batches) at the lowest rate until the
        # backlog of the start is worked off.
        warm = threading.Event()
        feeder = threading.Thread(
            target=generators.generate,
            args=(client, job, topology),
            kwargs={"rate": RATES[topology][0], "seed": 0, "id_prefix": "w-", "stop": warm.is_set},
        )
        feeder.start()
        try:
            final_stage = f"{stages[-1]}-1"
            waited = wait_steady(
                client, job, [final_stage], bound=P99_BOUND, timeout=150, batches=3
            )
            log.info("%s: steady after %.0f s of warm-up", topology, waited)
        except TimeoutError:
            log.error("%s: never steady at the lowest rate", topology)
            return {"topology": topology, "best": None, "steps": steps}
        finally:
            warm.set()
            feeder.join()
        for index, rate in enumerate(RATES[topology]):
            started = time.time()
            sent = generators.generate(
                client,
                job,
                topology,
                rate=rate,
                duration=args.step,
                seed=index + 1,
                id_prefix=f"s{index}-",
            )
            # The generator is one Python thread: record the rate it really achieved.
            achieved = sent / (time.time() - started)
            # Let the last inputs of the step come out before judging it.
            time.sleep(2)
            records = final_progress(client, job, started + args.settle, time.time())
            p99s = [r.latency_p99 for r in records if r.latency_p99 is not None]
            worst = max(p99s) if p99s else float("inf")
            passed = worst < P99_BOUND
            steps.append({"rate": rate, "achieved": achieved, "p99": worst, "passed": passed})
            log.info(
                "%s at %s/s: worst batch p99 %.2f s -> %s",
                topology,
                rate,
                worst,
                "pass" if passed else "fail",
            )
            if not passed:
                break
            best = rate
    finally:
        stop.set()
        supervise.join(timeout=60)
        keys.delete_job_keys(client, job)
        shutil.rmtree(root, ignore_errors=True)
    return {"topology": topology, "best": best, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    """Measure every selected topology and report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--topology", action="append", choices=sorted(RATES))
    parser.add_argument("--step", type=float, default=15, help="seconds per rate step")
    parser.add_argument("--settle", type=float, default=5, help="seconds ignored per step")
    parser.add_argument("--max-records", type=int, default=20000, help="per micro-batch")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = connect(args.redis_url)
    topologies = args.topology or list(RATES)
    results = [measure(client, args.redis_url, t, args) for t in topologies]
    opts = "".join(f" --topology {t}" for t in args.topology or [])
    lines = [
        f"Command: `{COMMAND}{opts} --step {args.step:g} --settle {args.settle:g} "
        f"--max-records {args.max_records}` ({time.strftime('%Y-%m-%d %H:%M')}, 2 cores; "
        "stages as separate processes, local[2] each, each topology's trigger: "
        f"{', '.join(f'{t} {get_topology(t).trigger_s:g} s' for t in topologies)}). "
        "Rates are input entries "
        "per second (wordcount: lines of about 7.5 words); a step passes if every batch's "
        f"event-time latency p99 stays under {P99_BOUND:g} s.",
        "",
        "| topology | highest sustained rate (p99 < 5 s) | steps (target rate: worst batch p99) |",
        "|---|---|---|",
    ]
    for r in results:
        steps = ", ".join(
            f"{s['rate']}/s (achieved {s['achieved']:.0f}/s): {s['p99']:.1f} s" for s in r["steps"]
        )
        best = f"{r['best']}/s" if r["best"] else f"< {RATES[r['topology']][0]}/s"
        if r["steps"] and all(s["passed"] for s in r["steps"]):
            best = f">= {r['best']}/s (every step passed)"
        lines.append(f"| {r['topology']} | {best} | {steps} |")
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result("Throughput", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
