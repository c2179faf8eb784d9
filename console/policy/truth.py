"""Ground truth computed in plain Python from a job's input entries, and how far the job's
results are from it.

Independent of the data plane's code on purpose: the console's audit of a running job
(console/services/recovery.py) and the strategy benchmark (bench/strategy/) check Spark's answers
against a second implementation, not against itself. Results are compared as *cells* (a word's
count for wordcount; an item's count in one window's top-N for topn), so that one missing or
doubled input event shows up as a count of 1 lost or duplicated. Pure Python, no Django imports.
"""

from __future__ import annotations

import json
import re
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
        return self.lost == 0 and self.duplicates == 0 and self.wrong_cells == 0


def line_words(text: str) -> list[str]:
    """A line's words by position, as the split operator numbers them: lower-cased, split on
    ASCII whitespace as Java's regex `\\s+` does (an empty word keeps its position)."""
    return re.split(r"\s+", text.lower(), flags=re.ASCII)


def wordcount_cells(entries: list[dict]) -> dict[str, int]:
    """Word -> count over the `text` of every entry (lower-cased, split on whitespace)."""
    counts: Counter = Counter()
    for entry in entries:
        counts.update(w for w in line_words(entry.get("text", "")) if w)
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


def compare_records(expected: dict[str, dict], actual: dict[str, list[dict]]) -> Comparison:
    """A user job's results against its reference (spark_runtime.user_plan.expected_results and
    actual_results): per key, a missing key is 1 lost, each record beyond one (an appended key
    written twice) or a key the reference lacks is 1 duplicate, and a value that differs is a
    wrong cell."""
    lost = duplicates = wrong = 0
    for key in expected.keys() | actual.keys():
        values = actual.get(key, [])
        if key not in expected:
            duplicates += len(values)
        elif not values:
            lost += 1
        else:
            duplicates += len(values) - 1
        wrong += key not in expected or not values or any(v != expected[key] for v in values)
    return Comparison(lost, duplicates, len(expected), wrong)


# --- auditing a running job's output (checked when a recovery episode closes) ---------------
#
# While input keeps coming, the results are compared with the ground truth of the input they
# reflect, not of the whole input:
# - wordcount: a word's count is its total over the input its stage consumed, and its version
#   names the word's latest occurrence in that input (the input entry; through an intermediate
#   stream, the stream entry whose `id` is `{input id}-{k}`, k the word's position in the line).
#   So the right count is the word's occurrences up to that occurrence, and a word the results
#   lack although the input up to the furthest version held it is lost.
# - a user job (spark_runtime/user_plan.py): every record of a batch carries the batch's end
#   offset as its version, and the sink's watermark moves to it once the whole batch is written.
#   So the reference over the input up to the watermark is what every key written by then must
#   hold; a key written after it (a batch being written) is judged against the reference over
#   the input up to its own version, and an appended key (no version) against the reference over
#   all the input read. A key the reference at the watermark has and the job lacks is lost,
#   unless the job appends the rows of an aggregate (Spark writes those only once the watermark
#   passes their window, later than the reference knows them).
# - topn: event time follows input order (the generator stamps entries as it writes them), so a
#   window is complete once the results hold a window that starts at least one window width
#   after its end; complete windows are compared cell by cell, and a complete window of the input
#   missing from the results is lost.

# The data plane's encodings (spark_runtime.redis_source.entry_pos, spark_runtime.sink.version),
# restated rather than imported: redis_source pulls in PySpark, and this module stays a second,
# independent implementation.
SEQ_FACTOR = 1_000_000  # an entry id as one long: ms * SEQ_FACTOR + seq
POSITION_DIGITS = 20  # a version starts with the position it derives from

# The payload field each checked topology's first operator reads (spark_runtime.pipelines).
PAYLOAD_FIELDS = {"wordcount": ("text",), "topn": ("item",)}


def entry_position(entry_id: str) -> int:
    """A Redis stream entry id (`ms-seq`) as the sortable long the data plane uses."""
    ms, seq = entry_id.split("-")
    return int(ms) * SEQ_FACTOR + int(seq)


def version_position(version: str) -> int:
    """The input (or intermediate stream) position a result's version derives from."""
    return int(version[:POSITION_DIGITS])


def valid_entries(topology: str, entries: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The input entries the data plane processes; the others go to the dead-letter stream
    (spark_runtime.redis_source.validate): no id, a ts that is not an integer, a missing
    payload field."""

    def valid(fields: dict) -> bool:
        if not fields.get("id") or any(f not in fields for f in PAYLOAD_FIELDS[topology]):
            return False
        try:
            int(fields.get("ts", ""))
        except ValueError:
            return False
        return True

    return [(entry_id, fields) for entry_id, fields in entries if valid(fields)]


def audit_wordcount(
    entries: list[tuple[str, dict]],
    results: dict[str, str],
    versions: dict[str, str],
    via_stream: dict[int, str] | None = None,
) -> Comparison:
    """Compare each stored word count with the word's count in the input up to the occurrence
    its version names.

    `entries`: the job's input as (entry id, fields), oldest first. `via_stream`: when the count
    stage reads an intermediate stream, that stream's `id` field per entry position (`{input
    id}-{k}`); None when it reads the input itself.
    """
    index_by_position = {entry_position(entry_id): i for i, (entry_id, _) in enumerate(entries)}
    index_by_id = {fields.get("id"): i for i, (_, fields) in enumerate(entries)}

    def origin(version: str) -> tuple[int, int] | None:
        """(input index, last word position) of the occurrence a version names."""
        position = version_position(version)
        if via_stream is None:
            index = index_by_position.get(position)
            return None if index is None else (index, 1 << 30)
        record_id = via_stream.get(position)
        if record_id is None or "-" not in record_id:
            return None
        input_id, k = record_id.rsplit("-", 1)
        index = index_by_id.get(input_id)
        return None if index is None else (index, int(k))

    cells = {word: int(count) for word, count in results.items()}
    wanted: list[tuple[tuple[int, int], str]] = []
    for word in cells:
        place = origin(versions.get(word, ""))
        if place is not None:  # else its origin is not in the input read: not judged
            wanted.append((place, word))
    wanted.sort()
    expected: dict[str, int] = {}
    counts: Counter = Counter()
    done = 0  # entries fully counted
    for (index, k), word in wanted:
        while done < index:
            counts.update(w for w in line_words(entries[done][1].get("text", "")) if w)
            done += 1
        line = line_words(entries[index][1].get("text", ""))
        expected[word] = counts[word] + sum(1 for w in line[: k + 1] if w == word)
    if wanted:
        # Everything up to the furthest occurrence any result names was consumed.
        (index, k), _ = wanted[-1]
        while done < index:
            counts.update(w for w in line_words(entries[done][1].get("text", "")) if w)
            done += 1
        counts.update(w for w in line_words(entries[index][1].get("text", ""))[: k + 1] if w)
        for word, count in counts.items():
            if word not in cells:
                expected[word] = count  # missing from the results: lost
    return compare(expected, {word: cells[word] for word in expected if word in cells})


def audit_topn(
    entries: list[tuple[str, dict]], results: dict[str, str], window_seconds: int, n: int
) -> Comparison:
    """Compare the top-N of every complete window (see above) with the input's."""
    width = window_seconds * 1000
    stored = [int(window) for window in results]
    if not stored:
        return Comparison(0, 0, 0, 0)
    complete_before = max(stored) - width  # windows ending at or before this are complete
    inputs = [
        fields
        for _, fields in entries
        if int(fields["ts"]) - int(fields["ts"]) % width + width <= complete_before
    ]
    expected = topn_cells(inputs, window_seconds, n)
    actual = {
        cell: count
        for cell, count in result_cells("topn", results).items()
        if int(cell.split("|")[0]) + width <= complete_before
    }
    return compare(expected, actual)


def audit_user_output(
    settled: dict[str, object],
    later: dict[str, object | None],
    actual: dict[str, list],
    judge_lost: bool = True,
) -> Comparison:
    """A running user job's output against its reference (see above). `settled`: the reference
    over the input up to the sink's watermark; `later`: for keys written past the watermark, the
    reference's value at a later point of the input (None: the reference lacks the key there);
    `actual`: what the job wrote, per key. `judge_lost` False leaves settled keys the job has
    not written unjudged."""
    expected = {k: v for k, v in settled.items() if judge_lost or k in actual}
    for key, value in later.items():
        if value is None:
            expected.pop(key, None)
        else:
            expected[key] = value
    return compare_records(expected, actual)
