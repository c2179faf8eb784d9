"""Spare footprint: what an idle warm spare holds before it is given a replica, per process.

    python -m bench.dataplane.spare_footprint [--runs 2] [--together 1] [--settle 15]
        [--jvm-options "..."]

Why: a node keeps warm spares so that a restart or a new standby skips the JVM and session
start (docs/POLICY.md, "Warm spares"), and each one is memory the job is charged for while it
waits. Each run starts one spare as a node agent does (registered `starting`, then
`python -m spark_runtime.spare`), waits until it reports itself idle, lets it settle, and reads
the RSS and PSS of its processes: the Python driver, its JVM, and the Python workers the
warm-up started (PySpark's daemon and its workers). Then the spare is told to stop. With
`--together N` each run starts N spares at once and reads each of them (PSS splits the pages
they share: the JVM's class data, with a class-data sharing archive, and the interpreters').
`--jvm-options` runs the spares with other JVM options than Backstop's (BACKSTOP_JVM_OPTIONS,
spark_runtime/config.py). Prints the figures and writes them to docs/RESULTS.md ("Data plane",
"Spare footprint").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import time

import psutil

from bench.dataplane.util import write_result
from infra.node_metrics import machine_identity
from spark_runtime import keys
from spark_runtime.activity import pss_mb
from spark_runtime.class_sharing import ARCHIVE_ENV, archive_path
from spark_runtime.config import JVM_OPTIONS_ENV, jvm_options, stage_env_overrides
from spark_runtime.launch import SPARE_MODULE, start_stage_process
from spark_runtime.redis_client import connect

log = logging.getLogger("bench.dataplane.spare_footprint")

COMMAND = "python -m bench.dataplane.spare_footprint"
NODE = "bench-footprint"
PARTS = ("Python driver", "JVM", "Python workers")
IDLE_TIMEOUT_S = 240


def part_of(proc: psutil.Process, root_pid: int) -> str:
    """Which part of a spare `proc` is: its Python driver (the root), its JVM, or a Python
    worker (every other descendant: PySpark's daemon and the workers it forks)."""
    if proc.pid == root_pid:
        return "Python driver"
    with contextlib.suppress(psutil.Error):
        if proc.name() == "java":
            return "JVM"
    return "Python workers"


def footprint(root_pid: int) -> dict[str, dict[str, float]]:
    """RSS and PSS (MiB) of each part of the spare rooted at `root_pid`, and their total."""
    root = psutil.Process(root_pid)
    procs = [root, *root.children(recursive=True)]
    parts: dict[str, list[psutil.Process]] = {part: [] for part in PARTS}
    for proc in procs:
        parts[part_of(proc, root_pid)].append(proc)
    figures = {}
    for part, members in parts.items():
        rss = 0.0
        for proc in members:
            with contextlib.suppress(psutil.Error):
                rss += proc.memory_info().rss / 2**20
        figures[part] = {"rss_mb": rss, "pss_mb": pss_mb(members) or 0.0, "processes": len(members)}
    figures["total"] = {
        name: sum(figures[part][name] for part in PARTS)
        for name in ("rss_mb", "pss_mb", "processes")
    }
    return figures


def wait_idle(client, spare_id: str, proc: subprocess.Popen) -> float:
    """Block until the spare reports itself idle; returns the seconds it took."""
    started = time.time()
    while time.time() - started < IDLE_TIMEOUT_S:
        raw = client.hget(keys.spares(NODE), spare_id)
        if raw is not None and json.loads(raw).get("state") == "idle":
            return time.time() - started
        if proc.poll() is not None:
            raise RuntimeError(f"spare {spare_id} exited with {proc.returncode} before idle")
        time.sleep(0.5)
    raise TimeoutError(f"spare {spare_id} not idle after {IDLE_TIMEOUT_S} s")


def start_spare(client, redis_url: str, options: str) -> tuple[str, subprocess.Popen]:
    """Start one spare as a node agent does: registered `starting` first
    (workers/node/spares.py, start_spare), then `python -m spark_runtime.spare`."""
    spare_id = f"spare-{NODE}-{time.time_ns()}"
    entry = {"pid": 0, "state": "starting", "since": time.time()}
    client.hset(keys.spares(NODE), spare_id, json.dumps(entry))
    proc = start_stage_process(
        SPARE_MODULE,
        ["--node", NODE, "--spare-id", spare_id, "--machine", machine_identity(),
         "--redis-url", redis_url],
        None,
        env_overrides={**stage_env_overrides(redis_url), JVM_OPTIONS_ENV: options},
    )  # fmt: skip
    return spare_id, proc


def stop_spare(client, spare_id: str, proc: subprocess.Popen) -> None:
    """Tell the spare to stop (its JVM exits normally), else kill its process group."""
    client.rpush(keys.spare_control(NODE, spare_id), json.dumps({"cmd": "stop"}))
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # its JVM and workers, if still there
    client.hdel(keys.spares(NODE), spare_id)
    client.delete(keys.spare_control(NODE, spare_id))


def measure_run(
    client, redis_url: str, number: int, together: int, settle_s: float, options: str
) -> list[dict]:
    """Start `together` spares at once, wait until each is idle and they have settled, read
    each one's footprint, stop them."""
    spares = [start_spare(client, redis_url, options) for _ in range(together)]
    try:
        warm = [wait_idle(client, spare_id, proc) for spare_id, proc in spares]
        log.info("run %d: idle after %s s; settling %g s", number,
                 ", ".join(f"{w:.1f}" for w in warm), settle_s)  # fmt: skip
        time.sleep(settle_s)
        figures = [footprint(proc.pid) for _, proc in spares]
        for each in figures:
            log.info(
                "run %d: RSS %.0f MB, PSS %.0f MB",
                number,
                each["total"]["rss_mb"],
                each["total"]["pss_mb"],
            )
        return [{"warm_s": w, "parts": f} for w, f in zip(warm, figures, strict=True)]
    finally:
        for spare_id, proc in spares:
            stop_spare(client, spare_id, proc)


def table(runs: list[dict]) -> list[str]:
    """One row per part: mean RSS and PSS over the runs, and the process count."""
    lines = [
        "| part | processes | RSS MB (runs) | PSS MB (runs) |",
        "|---|---|---|---|",
    ]
    for part in (*PARTS, "total"):
        rss = [r["parts"][part]["rss_mb"] for r in runs]
        pss = [r["parts"][part]["pss_mb"] for r in runs]
        count = runs[-1]["parts"][part]["processes"]
        lines.append(
            f"| {part} | {count:.0f} | {statistics.mean(rss):.0f} "
            f"({', '.join(f'{v:.0f}' for v in rss)}) | {statistics.mean(pss):.0f} "
            f"({', '.join(f'{v:.0f}' for v in pss)}) |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure `--runs` spares one after the other and report."""
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--runs", type=int, default=2, help="runs, one after the other")
    parser.add_argument("--together", type=int, default=1, help="spares started at once per run")
    parser.add_argument("--settle", type=float, default=15, help="seconds idle before reading")
    parser.add_argument(
        "--jvm-options", default=None, help="the spares' JVM options (default: Backstop's)"
    )
    parser.add_argument("--no-write", action="store_true", help="do not update docs/RESULTS.md")
    args = parser.parse_args(argv)
    options = jvm_options() if args.jvm_options is None else args.jvm_options.strip()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    client = connect(args.redis_url)
    runs = []
    for number in range(1, args.runs + 1):
        log.info("[%d/%d] starting %d spare(s)", number, args.runs, args.together)
        runs += measure_run(client, args.redis_url, number, args.together, args.settle, options)
    warm = ", ".join(f"{r['warm_s']:.0f}" for r in runs)
    archive = archive_path()
    if archive is None:
        sharing = f"off (`{ARCHIVE_ENV}`)"
    elif archive.is_file():
        sharing = f"`{archive.name}`"
    else:
        sharing = "no archive built yet"
    at_once = (
        "One idle warm spare at a time"
        if args.together == 1
        else f"{args.together} idle warm spares at once, each a row's value"
    )
    lines = [
        f"Command: `{COMMAND} --runs {args.runs}"
        + (f" --together {args.together}" if args.together != 1 else "")
        + f" --settle {args.settle:g}"
        + (f' --jvm-options "{args.jvm_options}"' if args.jvm_options is not None else "")
        + f"` ({time.strftime('%Y-%m-%d %H:%M')}, {psutil.cpu_count()} cores; JVM options "
        f"`{options or 'none'}`; class-data sharing: {sharing}). {at_once}, "
        f"read {args.settle:g} s after it reported itself idle (it turned idle "
        f"{warm} s after its start).",
        "",
        *table(runs),
    ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result("Spare footprint", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
