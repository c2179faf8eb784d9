"""Failover benchmark on wordcount: output gap after SIGKILL of the stage primary, restarted
from its checkpoint (local-restart) vs replaced by its hot standby (adaptive). By default the
fused one-query wordcount stage is killed (1 process, 2 with the standby); `--stages` kills the
`count` stage of the split job instead (2 processes, 3 with the standby).

    python -m spark_runtime.bench_failover [--rate 50] [--warmup 15] [--after 40] [--stages]

The output gap is measured from outside: a monitor polls the stage's results watermark in Redis
every 50 ms; the gap is the longest time without a new result write from the last write before
the kill onwards, while input keeps flowing at a constant rate. Prints the figures and writes
them to docs/RESULTS.md (section "Data plane").
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import statistics
import threading
import time

from spark_runtime import generators, keys
from spark_runtime.bench_util import (
    bench_runner,
    final_progress,
    wait_running,
    wait_steady,
    write_section,
)
from spark_runtime.redis_client import connect
from spark_runtime.topology import FUSED, PER_OPERATOR

log = logging.getLogger("spark_runtime.bench_failover")

COMMAND = "python -m spark_runtime.bench_failover"


def watch_writes(client, job: str, stage: str, stop: threading.Event, changes: list) -> None:
    """Record the time of every change of the stage's results watermark."""
    last = None
    key = keys.watermarks(job, stage)
    while not stop.is_set():
        mark = client.hget(key, "results")
        if mark != last:
            changes.append(time.time())
            last = mark
        time.sleep(0.05)


def scenario(client, redis_url: str, strategy: str, args) -> dict:
    """Run wordcount under `strategy`, kill the count primary after warm-up, measure."""
    job = f"bench-fo-{strategy}-{int(time.time())}"
    # The stage killed: the fused one-query wordcount ("job"), or "count" of the split stages.
    stage = "count" if args.stages else "job"
    active = {stage} if strategy == "adaptive" else set()
    runner, root = bench_runner(
        "wordcount",
        job,
        strategy,
        redis_url,
        client,
        active_stages=active,
        standby_nice=args.standby_nice,
        chaining=PER_OPERATOR if args.stages else FUSED,
    )
    finals = [f"{stage}-1"] + ([f"{stage}-2"] if active else [])
    replicas = (["split-1"] if args.stages else []) + finals
    stop = threading.Event()
    changes: list[float] = []
    threads: list[threading.Thread] = []
    try:
        runner.start()
        supervise = threading.Thread(target=runner.run, kwargs={"stop": stop.is_set})
        supervise.start()
        threads.append(supervise)
        log.info("%s: waiting for %s", strategy, replicas)
        wait_running(client, job, replicas)
        feeder = threading.Thread(
            target=generators.generate,
            args=(client, job, "wordcount"),
            kwargs={"rate": args.rate, "seed": 1, "stop": stop.is_set},
        )
        feeder.start()
        monitor = threading.Thread(target=watch_writes, args=(client, job, stage, stop, changes))
        monitor.start()
        threads += [feeder, monitor]
        log.info("%s: waiting for steady latency at %s lines/s", strategy, args.rate)
        waited = wait_steady(client, job, finals, bound=3.0, timeout=180)
        log.info(
            "%s: steady after %.0f s; %s s more before the kill", strategy, waited, args.warmup
        )
        time.sleep(args.warmup)
        killed_at = time.time()
        os.killpg(runner.launcher.pid(f"{stage}-1"), signal.SIGKILL)
        log.info("%s: SIGKILL %s-1; observing for %s s", strategy, stage, args.after)
        time.sleep(args.after)
        ended = time.time()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    before = [t for t in changes if t <= killed_at]
    after = [t for t in changes if t > killed_at]
    gap = (after[0] - before[-1]) if before and after else float("nan")
    base = final_progress(client, job, killed_at - args.warmup / 2, killed_at)
    base_p99 = [r.latency_p99 for r in base if r.latency_p99 is not None]
    baseline = statistics.median(base_p99) if base_p99 else float("nan")
    post = final_progress(client, job, killed_at, ended)
    peak = max((r.latency_p99 for r in post if r.latency_p99 is not None), default=None)
    recovered = None
    normal = max(2 * baseline, baseline + 1)
    for rec in post:
        if rec.latency_p99 is not None and rec.latency_p99 <= normal:
            recovered = rec.at - killed_at
            break
    history = [what for _, what in runner.supervisor.history]
    result = {
        "strategy": strategy,
        "gap": gap,
        "baseline_p99": baseline,
        "peak_p99": peak,
        "recovery": recovered,
        "history": history,
    }
    log.info("%s: %s", strategy, result)
    keys.delete_job_keys(client, job)
    # Logs stay in var/bench/{job}/logs for inspection; checkpoints go.
    shutil.rmtree(os.path.join(root, "checkpoints"), ignore_errors=True)
    return result


def fmt(value, unit="s") -> str:
    """A figure for the results table."""
    if value is None or value != value:  # None or NaN
        return "n/a"
    return f"{value:.1f} {unit}"


def main(argv: list[str] | None = None) -> int:
    """Run both scenarios and report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--rate", type=float, default=50, help="input lines per second")
    parser.add_argument("--warmup", type=float, default=15, help="seconds steady before kill")
    parser.add_argument("--after", type=float, default=40)
    parser.add_argument("--standby-nice", type=int, default=0)
    parser.add_argument(
        "--stages", action="store_true", help="split stages (kill count) instead of the fused job"
    )
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = connect(args.redis_url)
    results = [scenario(client, args.redis_url, s, args) for s in ("local-restart", "adaptive")]
    lines = [
        f"Command: `{COMMAND} --rate {args.rate:g} --warmup {args.warmup:g} "
        f"--after {args.after:g} --standby-nice {args.standby_nice}"
        f"{' --stages' if args.stages else ''}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, 2 cores, local[2] per stage process). "
        f"Wordcount ({'split stages, `count` killed' if args.stages else 'fused one-query stage'})"
        f" at {args.rate:g} lines/s (about {args.rate * 7.5:.0f} words/s), SIGKILL of "
        "the primary once every replica's p99 has stayed under 3 s for 5 "
        f"batches, plus {args.warmup:g} s; both scenarios in one run.",
        "",
        "| recovery | output gap | primary p99 before | peak p99 after | p99 back to normal |",
        "|---|---|---|---|---|",
    ]
    names = {"local-restart": "restart from checkpoint", "adaptive": "hot standby (promotion)"}
    for r in results:
        lines.append(
            f"| {names[r['strategy']]} | {fmt(r['gap'])} | {fmt(r['baseline_p99'])} | "
            f"{fmt(r['peak_p99'])} | {fmt(r['recovery'])} after the kill |"
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("Failover output gap (wordcount)", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
