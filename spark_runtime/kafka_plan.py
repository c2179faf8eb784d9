"""The read plan of a Kafka input: one total order over a topic's partitions, shared by replicas.

Backstop's exactly-once machinery needs every input record to have a position (`pos`) that is
the same in every replica and grows with the input: output versions, sink watermarks and a
standby's buffer trimming all compare positions (spark_runtime/sink.py). A Redis stream has one
such order (its entry ids); a Kafka topic has one per partition only, and two replicas reading
it on their own would cut their micro-batches at different per-partition offsets.

So the replicas of a stage share a *plan log*: a list of end-offset vectors, appended by
whichever replica first reaches the end of the log and finds new records (a compare-and-set on
the log's length, so two replicas never append two different plans at the same index). Plan
`i` covers, in each partition, the offsets from plan `i-1`'s end up to its own end (exclusive);
plan 0 is the starting point and covers nothing. A record's position is

    pos = plan_ms(i) * SEQ_FACTOR + ordinal

where `plan_ms` is the plan's creation time in epoch milliseconds (strictly increasing along the
log) and `ordinal` the record's rank inside the plan, partition by partition. Positions then read
like Redis entry ids (`ms-seq`), so "seconds of input behind" stays meaningful. A replica's
micro-batch covers whole plans, so its Spark offset is a plan index with its end vector (the
per-partition offsets are in Spark's checkpoint).

This module is pure: no Spark, no Kafka client, no Redis.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

# Must equal spark_runtime.redis_source.SEQ_FACTOR: positions of both sources share the format.
SEQ_FACTOR = 1_000_000
# Records in one plan at most: ordinals stay below SEQ_FACTOR, and a backlog is cut into plans.
MAX_PLAN_RECORDS = 100_000


@dataclass(frozen=True)
class Plan:
    """One entry of the plan log: its index, its creation time and where it ends."""

    index: int
    ms: int
    end: dict[int, int]  # partition -> first offset after the plan

    def to_json(self) -> str:
        return json.dumps({"ms": self.ms, "end": {str(p): o for p, o in self.end.items()}})

    @classmethod
    def from_json(cls, index: int, raw: str | bytes) -> Plan:
        data = json.loads(raw)
        return cls(index, int(data["ms"]), {int(p): int(o) for p, o in data["end"].items()})

    def offset(self) -> dict:
        """This plan as a Spark offset (JSON-serialisable)."""
        return {"plan": self.index, "end": {str(p): o for p, o in sorted(self.end.items())}}


def offset_plan_index(offset: dict) -> int:
    """The plan index of a Spark offset made by `Plan.offset`."""
    return int(offset["plan"])


def offset_end(offset: dict) -> dict[int, int]:
    """The per-partition end offsets of a Spark offset made by `Plan.offset`."""
    return {int(p): int(o) for p, o in offset["end"].items()}


def next_plan_ms(previous_ms: int, now_ms: int) -> int:
    """The creation time of the plan after one made at `previous_ms`: now, but always later."""
    return max(now_ms, previous_ms + 1)


def plan_size(start: dict[int, int], end: dict[int, int]) -> int:
    """Offsets covered between two end vectors (a partition missing from `start` starts at 0)."""
    return sum(max(0, o - start.get(p, 0)) for p, o in end.items())


def cut(start: dict[int, int], available: dict[int, int], budget: int) -> dict[int, int]:
    """The end vector of the next plan from `start`, taking at most `budget` offsets (0: no
    bound but MAX_PLAN_RECORDS) of what each partition has up to `available`.

    The budget is shared fairly: each round gives every partition that still has records an
    equal share, so a busy partition does not starve a quiet one.
    """
    budget = MAX_PLAN_RECORDS if budget <= 0 else min(budget, MAX_PLAN_RECORDS)
    end = {p: start.get(p, 0) for p in {*available, *start}}
    left = budget
    while left > 0:
        waiting = [p for p in sorted(available) if available[p] > end[p]]
        if not waiting:
            break
        share = max(1, left // len(waiting))
        for p in waiting:
            take = min(share, available[p] - end[p], left)
            end[p] += take
            left -= take
            if left == 0:
                break
    return end


def partition_ranges(start: dict[int, int], end: dict[int, int]) -> list[tuple[int, int, int, int]]:
    """The `(partition, first offset, end offset, ordinal base)` ranges of one plan, partition by
    partition: the ordinal of offset `o` in partition `p` is `base + o - first`."""
    ranges = []
    base = 0
    for p in sorted(end):
        first = start.get(p, 0)
        if end[p] > first:
            ranges.append((p, first, end[p], base))
            base += end[p] - first
    return ranges


class Segment(NamedTuple):
    """The offsets [first, end) of one partition inside one plan; the ordinal of offset `o` in
    the plan is `base + o - first`."""

    plan: int
    plan_ms: int
    partition: int
    first: int
    end: int
    base: int


# A micro-batch with at most this many records is read by one task: each task costs a Python
# worker's round trip and a broker lookup whatever its size, and at a steady rate a plan holds
# a handful of records per partition.
ONE_TASK_RECORDS = 5_000


def plan_segments(start: dict[int, int], plans: list[Plan]) -> list[Segment]:
    """The segments of `plans` (consecutive, the first one following the end vector `start`),
    plan by plan and partition by partition."""
    segments = []
    lower = start
    for plan in plans:
        for partition, first, end, base in partition_ranges(lower, plan.end):
            segments.append(Segment(plan.index, plan.ms, partition, first, end, base))
        lower = plan.end
    return segments


def task_groups(segments: list[Segment], one_task: int = ONE_TASK_RECORDS) -> list[list[Segment]]:
    """The segments each read task of a micro-batch takes: all of them in one task when they hold
    at most `one_task` records, else one task per partition (its segments are contiguous ranges
    of that partition, read in one pass). Segments keep their plan order inside a task."""
    if not segments:
        return []
    if sum(s.end - s.first for s in segments) <= one_task:
        return [list(segments)]
    by_partition: dict[int, list[Segment]] = {}
    for segment in segments:
        by_partition.setdefault(segment.partition, []).append(segment)
    return [by_partition[p] for p in sorted(by_partition)]


def position(plan_ms: int, ordinal: int) -> int:
    """The position of the record with `ordinal` in the plan created at `plan_ms`."""
    if not 0 <= ordinal < SEQ_FACTOR:
        raise ValueError(f"ordinal {ordinal} outside [0, {SEQ_FACTOR})")
    return plan_ms * SEQ_FACTOR + ordinal
