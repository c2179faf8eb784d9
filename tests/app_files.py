"""The input files and output readers of the example apps' tests (jobs/apps/): input written
as a file source must see it, and what the apps' sinks committed, read as their readers read it."""

from __future__ import annotations

import json
import os
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.app_restart.workload import committed_rows

START = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
USERS = ("u1", "u2", "u3", "u4")


def write_input(directory: Path, index: int, rows: list[dict]) -> None:
    """One input file, written aside and renamed in (a file source must see whole files), its
    modification time at least a millisecond after every file already there: files arrive in
    the order they are written, as files written seconds apart do.

    Spark's file source takes new files in modification-time order (milliseconds), and files
    with the same time in directory-listing order (on ext4 a hash of the name): five files
    written in a loop often share a millisecond, and a batch could take part-005 before
    part-004, whose windows part-005's events had already put behind the watermark, so an
    event-time app dropped them as late (the CI failure of the window-count test)."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory.parent / f".{directory.name}-{index}.tmp"
    partial.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    newest = max((p.stat().st_mtime_ns for p in directory.iterdir()), default=0)
    arrived = max(time.time_ns(), newest + 1_000_000)
    os.utime(partial, ns=(arrived, arrived))
    partial.rename(directory / f"part-{index:03d}.json")


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def purchases(file: int) -> list[dict]:
    return [
        {
            "user": USERS[(file * 7 + n) % 4],
            "amount": (file * 37 + n * 13) % 100,
            "ts": iso(START + timedelta(seconds=file * 10 + n)),
        }
        for n in range(10)
    ]


def newest_totals(directory: Path) -> dict:
    """Each user's total and count from the newest batch file that holds the user."""
    newest = {}
    files = sorted(directory.glob("batch-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    for file in files:
        for row in json.loads(file.read_text()):
            newest[row["user"]] = (row["total"], row["purchases"])
    return newest


def spend_expected(rows: list[dict], large: int) -> tuple[dict, Counter]:
    """What spend_totals.py computes from `rows`, in plain Python: each user's (total, count),
    and the purchases of at least `large` as (user, amount, ts)."""
    totals = defaultdict(lambda: (0, 0))
    for row in rows:
        total, count = totals[row["user"]]
        totals[row["user"]] = (total + row["amount"], count + 1)
    big = Counter((r["user"], r["amount"], r["ts"]) for r in rows if r["amount"] >= large)
    return dict(totals), big


def large_found(out: Path) -> Counter:
    """The large purchases spend_totals.py committed, as (user, amount, ts)."""
    return Counter((r["user"], r["amount"], r["ts"]) for r in committed_rows(out / "large"))
