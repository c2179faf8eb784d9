"""Ground truth computed in plain Python from a job's input entries, and how far the job's
results are from it.

Independent of the data plane's code on purpose: the benchmark checks Spark's answers against
a second implementation, not against itself. Results are compared as *cells* (a word's count for
wordcount; an item's count in one window's top-N for topn), so that one missing or doubled input
event shows up as a count of 1 lost or duplicated.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass

CHECKED_TOPOLOGIES = ("wordcount", "topn")


@dataclass(frozen=True)
class Comparison:
    """`lost`: counts the results lack; `duplicates`: counts they have in excess."""

    lost: int
    duplicates: int
    cells: int
    wrong_cells: int

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.duplicates == 0


def wordcount_cells(entries: list[dict]) -> dict[str, int]:
    """Word -> count over the `text` of every entry (lower-cased, split on whitespace)."""
    counts: Counter = Counter()
    for entry in entries:
        counts.update(entry.get("text", "").lower().split())
    return dict(counts)


def top_items_per_window(
    entries: list[dict], window_seconds: int, n: int
) -> dict[int, list[tuple[str, int]]]:
    """Window start (epoch ms) -> the `n` most frequent items of that tumbling window with their
    counts, by count descending then item ascending, as the topn job's contract says
    (docs/DATA_PLANE.md)."""
    width = window_seconds * 1000
    per_window: dict[int, Counter] = defaultdict(Counter)
    for entry in entries:
        ts = int(entry["ts"])
        per_window[ts - ts % width][entry["item"]] += 1
    return {
        window: sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        for window, counts in per_window.items()
    }


def topn_cells(entries: list[dict], window_seconds: int, n: int) -> dict[str, int]:
    """`{window start ms}|{item}` -> count for the `n` most frequent items of each window."""
    return {
        f"{window}|{item}": count
        for window, top in top_items_per_window(entries, window_seconds, n).items()
        for item, count in top
    }


def expected_cells(topology: str, entries: list[dict], params: dict) -> dict[str, int]:
    """The cells a correct job computes from `entries` (`params`: the topology's operator
    params, e.g. `{"window_seconds": 10, "n": 5}` for topn)."""
    if topology == "wordcount":
        return wordcount_cells(entries)
    if topology == "topn":
        return topn_cells(entries, int(params["window_seconds"]), int(params["n"]))
    raise ValueError(f"no ground truth for topology {topology!r}; checked: {CHECKED_TOPOLOGIES}")


def result_cells(topology: str, results: dict[str, str]) -> dict[str, int]:
    """The job's results hash (field -> value, as stored in Redis) as cells."""
    if topology == "wordcount":
        return {word: int(count) for word, count in results.items()}
    if topology == "topn":
        cells = {}
        for window, top in results.items():
            for item, count in json.loads(top):
                cells[f"{window}|{item}"] = int(count)
        return cells
    raise ValueError(f"no ground truth for topology {topology!r}; checked: {CHECKED_TOPOLOGIES}")


def compare(expected: dict[str, int], actual: dict[str, int]) -> Comparison:
    """Sum of shortfalls (lost) and of excesses (duplicates) over every cell of either side."""
    lost = duplicates = wrong = 0
    for cell in expected.keys() | actual.keys():
        difference = actual.get(cell, 0) - expected.get(cell, 0)
        if difference < 0:
            lost -= difference
        elif difference > 0:
            duplicates += difference
        wrong += difference != 0
    return Comparison(lost, duplicates, len(expected), wrong)
