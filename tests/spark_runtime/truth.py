"""Ground truth computed in plain Python from the input stream (never via spark_runtime code)."""

from __future__ import annotations

import zlib
from collections import Counter, defaultdict


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


def wordcount(entries) -> dict[str, int]:
    counts = Counter()
    for e in entries:
        counts.update(e["text"].lower().split())
    return dict(counts)


def topn(entries, window_seconds: int, n: int) -> dict[str, list]:
    width = window_seconds * 1000
    per_window: dict[int, Counter] = defaultdict(Counter)
    for e in entries:
        ts = int(e["ts"])
        per_window[ts - ts % width][e["item"]] += 1
    result = {}
    for window, counts in per_window.items():
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        result[str(window)] = [[item, count] for item, count in top]
    return result


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
