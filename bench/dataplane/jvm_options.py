"""JVM options: a stage process's CPU in its first minutes and its memory, with the JVM's
default options and with Backstop's (`config.JVM_OPTIONS`).

    python -m bench.dataplane.jvm_options [--topology wordcount] [--measure 120]

Why: a new process (a restarted primary, a new standby) and a promoted standby compete for the
cores with the replica that carries the job right after a fault (docs/DATA_PLANE.md, "JVM
options"). Each option set runs the topology's plain query (one fused stage, restart-all's)
under the local runner, fed `rate` entries per second from the moment it runs; the CPU time of
the stage's process tree (driver, JVM, Python workers) is read until it runs and then per
`window` seconds over `measure` seconds, and its RSS and PSS at the end. The option sets run one
after the other, twice each, alternating, so that a noisy neighbour hits both. Prints the
figures and writes them to docs/RESULTS.md ("Data plane", "JVM options").
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import psutil

from bench.dataplane.util import fused_stage, tree_cpu_s, write_result
from spark_runtime.activity import pss_mb, tree_rss_mb
from spark_runtime.config import JVM_OPTIONS, JVM_OPTIONS_ENV
from spark_runtime.redis_client import connect

log = logging.getLogger("bench.dataplane.jvm_options")

COMMAND = "python -m bench.dataplane.jvm_options"
OPTION_SETS = (("JVM defaults", ""), ("Backstop's", JVM_OPTIONS))


def tree_memory_mb(pid: int) -> tuple[float, float | None]:
    """(RSS, PSS) in MiB of process `pid` and its live descendants."""
    root = psutil.Process(pid)
    return tree_rss_mb(pid), pss_mb([root, *root.children(recursive=True)])


def jvm_arguments(pid: int) -> list[str]:
    """The command line of the JVM under process `pid` (empty if none is found)."""
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            if proc.name() == "java":
                return proc.cmdline()
        except psutil.Error:
            continue
    return []


def measure(client, redis_url: str, options: str, args) -> dict:
    """Run the topology fused with JVM `options` and return its CPU until running and per
    window, and its memory at the end."""
    os.environ[JVM_OPTIONS_ENV] = options  # the stage process the runner starts reads it
    job = f"bench-jvm-{args.topology}-{int(time.time())}"
    started = time.time()
    with fused_stage(client, redis_url, args.topology, job, args.rate) as (pid, start_feeding):
        running_s, start_cpu_s = time.time() - started, tree_cpu_s(pid)
        java = jvm_arguments(pid)
        missing = [o for o in options.split() if o not in java]
        if missing:
            raise RuntimeError(f"the stage's JVM runs without {missing}")
        start_feeding()
        windows = []
        for number in range(int(args.measure // args.window)):
            before = tree_cpu_s(pid)
            time.sleep(args.window)
            windows.append(100.0 * (tree_cpu_s(pid) - before) / args.window)
            cpu = windows[-1]
            log.info("%s: window %d: %.0f%% of a core", options or "defaults", number + 1, cpu)
        rss, pss = tree_memory_mb(pid)
    return {
        "running_s": running_s,
        "start_cpu_s": start_cpu_s,
        "windows": windows,
        "rss_mb": rss,
        "pss_mb": pss,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure each option set in turn (`--rounds` times, alternating) and report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--topology", default="wordcount")
    parser.add_argument("--rate", type=float, default=50, help="input entries per second")
    parser.add_argument("--window", type=float, default=15, help="seconds per CPU window")
    parser.add_argument("--measure", type=float, default=120, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each option set")
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = connect(args.redis_url)
    saved = os.environ.get(JVM_OPTIONS_ENV)
    rows = []
    try:
        for round_number in range(args.rounds):
            for label, options in OPTION_SETS:
                log.info("round %d/%d: %s", round_number + 1, args.rounds, label)
                rows.append((label, options, measure(client, args.redis_url, options, args)))
    finally:
        if saved is None:
            os.environ.pop(JVM_OPTIONS_ENV, None)
        else:
            os.environ[JVM_OPTIONS_ENV] = saved
    span = f"{args.window:g} s"
    lines = [
        f"Command: `{COMMAND} --topology {args.topology} --rate {args.rate:g} --window "
        f"{args.window:g} --measure {args.measure:g} --rounds {args.rounds}` "
        f"({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores). The topology's plain "
        "query (one fused stage, restart-all's) under the local runner, with the JVM's default "
        f"options and with Backstop's (`{JVM_OPTIONS}`), alternating; CPU of the stage's "
        "process tree (driver, JVM, Python workers) in percent of one core, per "
        f"{span} window from the moment the stage runs and its input starts; memory at the end.",
        "",
        f"| JVM options | running after s | CPU s until running | CPU % per {span} window | "
        "mean of the first 4 windows | RSS MB | PSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, _options, r in rows:
        first = r["windows"][:4]
        pss = "n/a" if r["pss_mb"] is None else f"{r['pss_mb']:.0f}"
        lines.append(
            f"| {label} | {r['running_s']:.1f} | {r['start_cpu_s']:.1f} | "
            f"{', '.join(f'{w:.0f}' for w in r['windows'])} | "
            f"{sum(first) / max(1, len(first)):.0f} | {r['rss_mb']:.0f} | {pss} |"
        )
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result("JVM options", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
