"""Failover benchmark on wordcount: output gap after SIGKILL of the stage primary, restarted
from its checkpoint (local-restart) vs replaced by its hot standby (adaptive). By default the
fused one-query wordcount stage is killed (1 process, 2 with the standby); `--stages` kills the
`count` stage of the split job instead (2 processes, 3 with the standby).

    python -m bench.dataplane.failover [--rate 50] [--warmup 15] [--after 60] [--stages]

The output gap is measured from outside: a monitor polls the stage's results watermark in Redis
every 50 ms; the gap is the longest time without a new result write from the last write before
the kill onwards, while input keeps flowing at a constant rate. Whether and when the job is back
to normal is the console's judgement (console/policy/recovery.py, `measure_faults`): throughput
and p90 latency of its output back in the band learned over the `--warmup` seconds before the
kill, and staying there for `--stable-window` seconds; so `--after` must leave room for the
recovery plus the stable window plus 5 s of smoothing, or the recovery is reported as not seen.
Prints the figures and writes them to docs/RESULTS.md (section "Data plane").
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

from bench.dataplane.util import bench_runner, wait_running, wait_steady, write_result
from console.policy.config import PolicyConfig
from console.policy.recovery import MIN_REFERENCE_S, RecoverySettings, measure_faults
from spark_runtime import generators, keys
from spark_runtime.progress import ProgressRecord, read_progress
from spark_runtime.redis_client import connect
from spark_runtime.topology import FUSED, PER_OPERATOR

log = logging.getLogger("bench.dataplane.failover")

COMMAND = "python -m bench.dataplane.failover"


def watch_writes(client, job: str, stage: str, stop: threading.Event, changes: list) -> None:
    """Record the time of every change of the stage's results watermark."""
    key = keys.watermarks(job, stage)
    last = client.hget(key, "results")  # a change is a write seen after the monitor started
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
        steady_at = time.time()
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
    records = read_progress(client, job, steady_at - 5, ended)
    figures = judge(records, changes, killed_at, steady_at, ended, args)
    history = [what for _, what in runner.supervisor.history]
    result = {"strategy": strategy, **figures, "history": history}
    log.info("%s: %s", strategy, result)
    keys.delete_job_keys(client, job)
    # Logs stay in var/bench/{job}/logs for inspection; checkpoints go.
    shutil.rmtree(os.path.join(root, "checkpoints"), ignore_errors=True)
    return result


def recovery_settings(args) -> RecoverySettings:
    """How the kill is judged: the console's band and this run's stable window, "normal"
    learned over the `--warmup` seconds between the steady state and the kill."""
    return RecoverySettings(
        band=args.band,
        stable_window_s=args.stable_window,
        reference_window_s=args.warmup,
        warmup_s=0.0,
    )


def judge(
    records: list[ProgressRecord],
    changes: list[float],
    killed_at: float,
    steady_at: float,
    ended: float,
    args,
) -> dict:
    """The figures of one scenario: the output gap (on the watermark's `changes`), whether and
    when the output was back to normal and its peak p99 until then (console.policy.recovery,
    on the progress `records`), and the primary's median p99 over the second half of the warm-up
    before the kill (seconds; NaN without batches)."""
    (measured,) = measure_faults(
        records,
        [killed_at],
        input_started_at=steady_at,
        end=ended,
        watch_ended=True,
        settings=recovery_settings(args),
        output_times=changes,
    )
    before = [
        r.latency_p99
        for r in records
        if r.is_primary
        and r.final
        and r.latency_p99 is not None
        and killed_at - args.warmup / 2 <= r.at <= killed_at
    ]
    peak = measured.peak_p99_ms
    return {
        "gap": measured.downtime_s,
        "baseline_p99": statistics.median(before) if before else float("nan"),
        "peak_p99": None if peak is None else peak / 1000.0,
        "recovery": measured.recovery_time_s,
        "watched": measured.watched_s,
        "note": measured.note,
    }


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
    parser.add_argument(
        "--warmup",
        type=float,
        default=15,
        help=f"seconds steady before the kill, where normal is learned (at least "
        f"{MIN_REFERENCE_S:g})",
    )
    parser.add_argument("--after", type=float, default=60, help="seconds observed after the kill")
    parser.add_argument(
        "--band",
        type=float,
        default=PolicyConfig().recovery_band,
        help="recovery band (the policy's default recovery_band)",
    )
    parser.add_argument(
        "--stable-window",
        type=float,
        default=10.0,
        help="seconds back in band that count as recovered (as manage.py bench)",
    )
    parser.add_argument("--standby-nice", type=int, default=0)
    parser.add_argument(
        "--stages", action="store_true", help="split stages (kill count) instead of the fused job"
    )
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    if args.warmup < MIN_REFERENCE_S:
        parser.error(f"--warmup: at least {MIN_REFERENCE_S:g} s to learn what normal output is")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = connect(args.redis_url)
    results = [scenario(client, args.redis_url, s, args) for s in ("local-restart", "adaptive")]
    lines = [
        f"Command: `{COMMAND} --rate {args.rate:g} --warmup {args.warmup:g} "
        f"--after {args.after:g} --band {args.band:g} --stable-window {args.stable_window:g} "
        f"--standby-nice {args.standby_nice}{' --stages' if args.stages else ''}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, 2 cores, local[2] per stage process). "
        f"Wordcount ({'split stages, `count` killed' if args.stages else 'fused one-query stage'})"
        f" at {args.rate:g} lines/s (about {args.rate * 7.5:.0f} words/s), SIGKILL of "
        "the primary once every replica's p99 has stayed under 3 s for 5 "
        f"batches, plus {args.warmup:g} s; both scenarios in one run. Back to normal: the "
        "console's judgement (console/policy/recovery.py): throughput and p90 latency of the "
        f"output within the band ({args.band:g}) learned over the {args.warmup:g} s before the "
        f"kill, for {args.stable_window:g} s; peak p99 is the output's until then (a second "
        "without output counts the time since the last one).",
        "",
        "| recovery | output gap | primary p99 before | peak p99 until normal | back to normal |",
        "|---|---|---|---|---|",
    ]
    names = {"local-restart": "restart from checkpoint", "adaptive": "hot standby (promotion)"}
    for r in results:
        normal = (
            f"{fmt(r['recovery'])} after the kill"
            if r["recovery"] is not None
            else f"not within {r['watched']:.0f} s ({r['note']})"
        )
        lines.append(
            f"| {names[r['strategy']]} | {fmt(r['gap'])} | {fmt(r['baseline_p99'])} | "
            f"{fmt(r['peak_p99'])} | {normal} |"
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result("Failover output gap (wordcount)", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
