"""Where a stage JVM's resident memory grows: the JVM's own accounts beside its RSS.

    python -m bench.dataplane.native_memory [--minutes 20] [--sample 60] [--no-write]

Why: in the hour soak of 2026-11-30 a primary grew 673 -> 767 MB (+14%) between its 10th and
22nd minute, and in `bench.dataplane.periodic_gc` RSS grew about 5% from minute 10 to 20 with
any initial heap.

Each variant runs the query of `periodic_gc` (a rate source at 20 rows/s, a Python UDF, a count
by key in RocksDB state, the noop sink, Backstop's session settings and JVM options) in a process
of its own, all at once, with `-XX:NativeMemoryTracking=summary`. Every `sample` seconds it reads
the driver JVM's RSS and `jcmd PID VM.native_memory summary`: what the JVM committed per
category (heap, metaspace, code cache, threads, its collector's structures, its own mallocs).
NMT does not see what native libraries allocate with malloc (RocksDB's memtables and block
cache, through JNI): growth of RSS that no category shows is theirs, or the C library's arenas
holding memory freed by them, or heap pages touched for the first time within a committed heap:
each sample also reads how much of the heap's address range is resident (/proc/PID/smaps, the
range from `jcmd PID GC.heap_info`). The variants: Backstop's settings, and the same with
MALLOC_ARENA_MAX=2 (glibc gives a threaded process up to 8 arenas per core and keeps what is
freed in each). Prints the figures and writes them to docs/RESULTS.md ("Data plane", "Native
memory").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from bench.dataplane.periodic_gc import end_children, sample_at, sample_side_by_side
from bench.dataplane.util import write_result
from spark_runtime.config import DEFAULT_MASTER, JVM_OPTIONS_ENV, jvm_options

COMMAND = "python -m bench.dataplane.native_memory"
NMT_OPTION = "-XX:NativeMemoryTracking=summary"
# The variants: (label, environment added to the process).
VARIANTS = (("Backstop's settings", {}), ("MALLOC_ARENA_MAX=2", {"MALLOC_ARENA_MAX": "2"}))
# "Total: reserved=1760533KB, committed=326473KB" and "-   Java Heap (reserved=..., committed=...)"
TOTAL = re.compile(r"^Total: reserved=\d+KB, committed=(\d+)KB", re.MULTILINE)
CATEGORY = re.compile(r"^-\s+(.+?) \(reserved=\d+KB, committed=(\d+)KB", re.MULTILINE)
# The address ranges of a collector's spaces in `jcmd PID GC.heap_info`, e.g. "tenured
# generation total 218688K, used 140000K [0x00000000d5550000, 0x00000000e2aa0000,
# 0x0000000100000000)": start, end of committed, end of reserved.
SPACE_RANGE = re.compile(r"\[0x([0-9a-f]+), 0x[0-9a-f]+, 0x([0-9a-f]+)\)")
# A mapping's first line in /proc/PID/smaps ("7f00a000-7f00b000 rw-p ...") and its Rss line.
MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) ")
RSS_LINE = re.compile(r"^Rss:\s+(\d+) kB")
# The categories shown one by one; the others are summed as "other".
SHOWN = ("Java Heap", "Class", "Metaspace", "Code", "Thread", "GC", "Internal", "Other")
# Not an NMT category: how much of the heap is resident (smaps), kept beside them in a sample.
HEAP_RESIDENT = "heap resident"


def committed_mb(summary: str) -> dict[str, float]:
    """Committed MiB per category of a `VM.native_memory summary`, and `total`."""
    total = TOTAL.search(summary)
    if total is None:
        raise RuntimeError(f"not a native memory summary:\n{summary[:500]}")
    found = {name: int(kb) / 1024 for name, kb in CATEGORY.findall(summary)}
    found["total"] = int(total.group(1)) / 1024
    return found


def heap_range(heap_info: str) -> tuple[int, int]:
    """The Java heap's reserved address range [start, end) from `GC.heap_info`."""
    ranges = [(int(lo, 16), int(hi, 16)) for lo, hi in SPACE_RANGE.findall(heap_info)]
    if not ranges:
        raise RuntimeError(f"no heap address range in:\n{heap_info[:500]}")
    return min(lo for lo, _ in ranges), max(hi for _, hi in ranges)


def resident_mb_in(smaps: str, start: int, end: int) -> float:
    """MiB resident in the mappings of `smaps` that lie within [start, end)."""
    total_kb, inside = 0, False
    for line in smaps.splitlines():
        mapping = MAPPING.match(line)
        if mapping:
            lo, hi = int(mapping.group(1), 16), int(mapping.group(2), 16)
            inside = lo >= start and hi <= end
            continue
        rss = RSS_LINE.match(line)
        if rss and inside:
            total_kb += int(rss.group(1))
    return total_kb / 1024


def heap_resident_mb(pid: int) -> float:
    """How much of JVM `pid`'s Java heap is resident (MiB): the pages RSS counts of it."""
    info = subprocess.run(
        ["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    start, end = heap_range(info)
    with open(f"/proc/{pid}/smaps") as handle:
        return resident_mb_in(handle.read(), start, end)


def start(label: str, extra_env: dict, args) -> dict:
    """Start periodic_gc's query (at Spark's default periodic collection) with NMT on."""
    env = {**os.environ, **extra_env}
    env[JVM_OPTIONS_ENV] = f"{jvm_options()} {NMT_OPTION}"
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.dataplane.periodic_gc", "--child", "30min",
         "--trigger", str(args.trigger), "--minutes", str(args.minutes)],
        stdout=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    return {"label": label, "child": child, "samples": []}


def sample(run: dict, minute: float) -> None:
    """One sample of a running variant: RSS and the JVM's committed memory per category."""
    pid = run["jvm"].pid
    summary = subprocess.run(
        ["jcmd", str(pid), "VM.native_memory", "summary", "scale=KB"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    rss = run["jvm"].memory_info().rss / 2**20
    committed = committed_mb(summary)
    committed[HEAP_RESIDENT] = heap_resident_mb(pid)
    run["samples"].append((minute, rss, committed))
    print(f"  {run['label']}: {minute:4.1f} min RSS {rss:5.0f} MB, JVM committed "
          f"{run['samples'][-1][2]['total']:5.0f} MB", flush=True)  # fmt: skip


def measure(args) -> list[dict]:
    """Run every variant at once and sample each until they finish."""
    runs: list[dict] = []
    try:
        for label, extra_env in VARIANTS:
            runs.append(start(label, extra_env, args))
        # jcmd needs a while: no sample in the last 0.2 minute, as the query ends.
        sample_side_by_side(runs, args.sample, args.minutes - 0.2, sample)
        for run in runs:
            code = run["child"].wait(timeout=120)
            if code != 0:
                raise SystemExit(f"{run['label']}: the query's process failed (exit {code})")
    finally:
        end_children(runs)
    return runs


def rows(run: dict, since: float) -> list[str]:
    """Table rows of a variant: RSS, the JVM's total and its categories at `since` and at the
    end, and the change."""
    first, last = sample_at(run["samples"], since), run["samples"][-1]

    def row(name: str, before: float, after: float) -> str:
        return f"| {run['label']} | {name} | {before:.1f} | {after:.1f} | {after - before:+.1f} |"

    lines = [row("RSS", first[1], last[1]), row("JVM committed (NMT total)", *(
        s[2]["total"] for s in (first, last)))]  # fmt: skip
    for name in SHOWN:
        lines.append(row(name, first[2].get(name, 0.0), last[2].get(name, 0.0)))
    rest = [
        sum(mb for name, mb in s[2].items() if name not in (*SHOWN, "total", HEAP_RESIDENT))
        for s in (first, last)
    ]
    lines.append(row("the other categories", *rest))
    outside = [s[1] - s[2]["total"] for s in (first, last)]
    lines.append(row("RSS less JVM committed", *outside))
    if HEAP_RESIDENT in first[2] and HEAP_RESIDENT in last[2]:
        heap = [s[2][HEAP_RESIDENT] for s in (first, last)]
        lines.append(row("Java Heap resident (smaps)", *heap))
        lines.append(row("RSS less heap resident", first[1] - heap[0], last[1] - heap[1]))
    return lines


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="how long each query runs")
    parser.add_argument("--since", type=float, default=10.0, help="the minute growth is from")
    parser.add_argument("--trigger", type=float, default=0.2, help="trigger interval, s")
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/RESULTS.md")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.since >= args.minutes:
        raise SystemExit("--since must be before the end (--minutes)")
    print(f"{'; '.join(label for label, _ in VARIANTS)} side by side: {args.minutes:g} min at a "
          f"{args.trigger:g} s trigger, {NMT_OPTION}", flush=True)  # fmt: skip
    runs = measure(args)
    for run in runs:
        if not run["samples"]:
            raise SystemExit(f"{run['label']}: nothing measured (--minutes too short?)")
    end = min(run["samples"][-1][0] for run in runs)
    lines = [
        f"Command: `{COMMAND} --minutes {args.minutes:g} --since {args.since:g} --sample "
        f"{args.sample:g}` ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
        f"{DEFAULT_MASTER}). The query of `periodic_gc` (20 rows/s, a Python UDF, a count by key "
        f"in RocksDB state, the noop sink, a {args.trigger:g} s trigger) with Backstop's session "
        f"settings and JVM options plus `{NMT_OPTION}`, one process per variant, all at once. "
        "MB committed by the driver JVM per category (`jcmd PID VM.native_memory summary`) and "
        f"its RSS, at minute {args.since:g} and at the last sample (minute {end:.1f}). NMT does "
        "not see native libraries' mallocs (RocksDB's): RSS growth no category shows is theirs "
        "or the C library's, or heap pages touched for the first time: the heap's resident size "
        "(the Rss of its mappings in /proc/PID/smaps) tells those apart.",
        "",
        f"| variant | what | MB at {args.since:g} min | MB at the end | change |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        lines += rows(run, args.since)
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_result("Native memory", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
