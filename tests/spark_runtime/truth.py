"""Ground truth computed in plain Python from the input stream (never via spark_runtime code).

Wordcount and top-N come from console/policy/truth.py (plain Python too, shared with the strategy
benchmark and tested on hand-counted inputs in tests/policy/test_truth.py)."""

from __future__ import annotations

import zlib
from collections import defaultdict

from console.policy.truth import top_items_per_window
from console.policy.truth import wordcount_cells as wordcount  # noqa: F401 (used by the tests)


def valid_entries(client, stream: str, payload: list[str]) -> list[dict]:
    """The well-formed entries of the stream, in stream order."""
    good = []
    for _entry, fields in client.xrange(stream):
        if not fields.get("id") or "ts" not in fields:
            continue
        try:
            int(fields["ts"])
        except ValueError:
            continue
        if any(name not in fields for name in payload):
            continue
        good.append(fields)
    return good


def malformed_count(client, stream: str, payload: list[str]) -> int:
    return client.xlen(stream) - len(valid_entries(client, stream, payload))


def topn(entries, window_seconds: int, n: int) -> dict[str, list]:
    """Window start (ms, as the results hash field) -> [[item, count], ...]."""
    return {
        str(window): [[item, count] for item, count in top]
        for window, top in top_items_per_window(entries, window_seconds, n).items()
    }


def traffic(entries) -> dict[str, dict]:
    pairs: dict[tuple, dict] = defaultdict(dict)
    for e in entries:
        key = (e["sensor"], int(e["lane"]), int(e["ts"]) // 1000)
        pairs[key][e["kind"]] = float(e["value"])
    per_location: dict[str, list] = defaultdict(list)
    for (sensor, _lane, second), kinds in pairs.items():
        if "speed" in kinds and "flow" in kinds:
            per_location[f"{sensor}|{second}"].append((kinds["speed"], kinds["flow"]))
    return {
        loc: {
            "avg_speed": round(sum(s for s, _ in rows) / len(rows), 3),
            "total_flow": round(sum(f for _, f in rows), 3),
            "lanes": len(rows),
        }
        for loc, rows in per_location.items()
    }


def shuffle(entries, keys: int, selectivity: float):
    """(final state per key, multiset of emitted (key, count, sum) outputs)."""
    period = max(1, round(1 / selectivity))
    state: dict[str, list[int]] = {}
    outputs = []
    for e in entries:
        key = f"k{zlib.crc32(e['id'].encode()) % keys}"
        count, total = state.get(key, [0, 0])
        count, total = count + 1, total + int(e["value"])
        state[key] = [count, total]
        if count % period == 0:
            outputs.append((key, count, total))
    return {k: {"count": c, "sum": s} for k, (c, s) in state.items()}, sorted(outputs)
