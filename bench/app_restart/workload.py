"""The app benchmark's workload and measures, in plain Python (no Spark, no Django).

The input is JSON-lines click files (what jobs/apps/window_counts.py reads): one file of
CLICKS_PER_FILE clicks per file interval, event time one second apart from file to file, so
the app's watermark moves with the files and no click comes late. The reference is computed
from the clicks written (`closed_windows`), and the app's output is read as the file sink's
readers read it (`committed_rows`): only the files its `_spark_metadata` log committed.

A restart is measured on the query's own checkpoint: a batch is complete once its commit file
(`<checkpoint>/commits/<batch id>`) is written, so the first commit file written after the kill
is the first completed batch after the restart (`first_commit_after`). The same measure serves
both the `spark-submit` loop and Backstop: it needs nothing but the checkpoint directory.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

START = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
USERS = ("u1", "u2", "u3")
CLICKS_PER_FILE = 10
# The app's watermark delay (window_counts.py: withWatermark("ts", "5 seconds")) and window.
WATERMARK_DELAY_S = 5
WINDOW_S = 10
# The default `--args` of an app benchmark: the placeholders are each run's own directories.
DEFAULT_ARGS = "--in {in} --out {out} --checkpoint {checkpoint}"
PLACEHOLDERS = ("in", "out", "checkpoint")


def iso(moment: datetime) -> str:
    """`moment` as the input's timestamps are written (milliseconds, UTC)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def clicks(file: int) -> list[dict]:
    """The clicks of input file `file`: CLICKS_PER_FILE of them, 1 s apart in event time, the
    files one after the other."""
    rows = []
    for n in range(CLICKS_PER_FILE):
        second = file * CLICKS_PER_FILE + n
        moment = START + timedelta(seconds=second)
        rows.append(
            {"user": USERS[(file + n) % len(USERS)], "page": f"p{n % 4}", "ts": iso(moment)}
        )
    return rows


def write_input(directory: Path, index: int, rows: list[dict]) -> None:
    """One input file, written aside and renamed in: a file source must only see whole files."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory.parent / f".{directory.name}-{index}.tmp"
    partial.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    partial.rename(directory / f"part-{index:05d}.json")


def closed_windows(rows: list[dict], delay_s: int = WATERMARK_DELAY_S) -> Counter:
    """Clicks per (user, window start) of the windows the watermark (the newest event time
    less `delay_s`) has closed: what the app's append-mode output holds once it has caught up."""
    if not rows:
        return Counter()
    times = [datetime.fromisoformat(r["ts"].replace("Z", "+00:00")) for r in rows]
    watermark = max(times) - timedelta(seconds=delay_s)
    counts = Counter()
    for row, moment in zip(rows, times, strict=True):
        start = moment.replace(second=moment.second - moment.second % WINDOW_S, microsecond=0)
        if start + timedelta(seconds=WINDOW_S) <= watermark:
            counts[(row["user"], start.strftime("%Y-%m-%dT%H:%M:%SZ"))] += 1
    return counts


def committed_rows(out: Path) -> list[dict]:
    """The rows of the files a file sink committed (those its _spark_metadata log lists; a
    killed batch may leave other files behind, which the sink's readers never see)."""
    log = out / "_spark_metadata"
    if not log.is_dir():
        return []
    files = set()
    for entry in log.iterdir():
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue
        for line in entry.read_text().splitlines()[1:]:
            files.add(Path(json.loads(line)["path"].removeprefix("file:")).name)
    rows = []
    for name in files:
        rows += [json.loads(line) for line in (out / name).read_text().splitlines() if line]
    return rows


def exactness(expected: Counter, rows: list[dict]) -> dict:
    """The app's committed window rows against the reference: `lost` (expected windows with no
    row), `duplicated` (extra rows of a window), `wrong` (a window's count differs, or a window
    the reference does not close); `exact` when all three are 0."""
    keyed = Counter((r["user"], r["window_start"]) for r in rows)
    found = {(r["user"], r["window_start"]): r["clicks"] for r in rows}
    lost = sum(1 for key in expected if key not in found)
    duplicated = sum(n - 1 for n in keyed.values() if n > 1)
    wrong = sum(1 for key, value in found.items() if expected.get(key) != value)
    return {
        "windows": len(expected),
        "lost": lost,
        "duplicated": duplicated,
        "wrong": wrong,
        "exact": lost == duplicated == wrong == 0,
    }


def first_commit_after(checkpoint: Path, after: float) -> float | None:
    """When the first batch completed after `after` (epoch seconds): the earliest modification
    time of a commit file of the query's checkpoint written since, or None."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return None
    times = []
    for entry in commits.iterdir():
        if entry.name.isdigit():
            try:
                written = entry.stat().st_mtime
            except FileNotFoundError:  # compacted away meanwhile
                continue
            if written > after:
                times.append(written)
    return min(times) if times else None


def expand_args(template: str, directories: dict[str, str]) -> list[str]:
    """The app's arguments: `template` split on whitespace, each `{in}`, `{out}`,
    `{checkpoint}` replaced by the run's directory; ValueError naming `--args` for another
    placeholder."""
    args = []
    for word in template.split():
        try:
            args.append(word.format(**directories))
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"--args: {word!r}: only the placeholders {{in}}, {{out}}, {{checkpoint}} "
                f"are known ({exc})"
            ) from None
    return args


def summary(recoveries: list[float | None]) -> dict:
    """Mean, min and max of the measured recoveries (s); `missed`: faults with none measured."""
    measured = [r for r in recoveries if r is not None]
    return {
        "mean_s": round(statistics.fmean(measured), 2) if measured else None,
        "min_s": round(min(measured), 2) if measured else None,
        "max_s": round(max(measured), 2) if measured else None,
        "missed": len(recoveries) - len(measured),
    }


def warm_to_cold(warm_mean_s: float | None, cold_mean_s: float | None) -> float | None:
    """The warm restart's mean recovery as a fraction of the cold one's (the goal: <= 0.40)."""
    if warm_mean_s is None or not cold_mean_s:
        return None
    return round(warm_mean_s / cold_mean_s, 3)
