"""How a micro-batch's plans are cut into read tasks (spark_runtime/kafka_plan.py): every record
of the plans is read by exactly one task and gets the plan and ordinal the plan log defines,
whether the plans are read in one task or one task per partition. The expected placement is
worked out here from the definition (plan i covers, per partition, the offsets after plan i-1's
end up to its own; ordinals run partition by partition), not with the module's helpers."""

from __future__ import annotations

from bisect import bisect_right

from spark_runtime.kafka_plan import Plan, plan_segments, task_groups

START = {0: 10, 1: 0, 2: 5}
PLANS = [
    Plan(4, 1_000, {0: 13, 1: 2, 2: 5}),
    Plan(5, 1_300, {0: 13, 1: 6, 2: 9}),
    Plan(6, 1_600, {0: 20, 1: 6, 2: 10}),
]


def expected_placement() -> dict[tuple[int, int], tuple[int, int]]:
    """(partition, offset) -> (plan_ms, ordinal), by the plan log's definition."""
    placed = {}
    lower = dict(START)
    for plan in PLANS:
        ordinal = 0
        for partition in sorted(plan.end):
            for offset in range(lower[partition], plan.end[partition]):
                placed[(partition, offset)] = (plan.ms, ordinal)
                ordinal += 1
        lower = dict(plan.end)
    return placed


def read_as_the_tasks_do(groups) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Each task's records as KafkaPlanReader.read places them: per partition one pass over
    its segments' span, each offset in the segment that holds it."""
    seen = []
    for group in groups:
        partitions = sorted({s.partition for s in group})
        for partition in partitions:
            segments = [s for s in group if s.partition == partition]
            starts = [s.first for s in segments]
            for offset in range(segments[0].first, segments[-1].end):
                segment = segments[bisect_right(starts, offset) - 1]
                ordinal = segment.base + offset - segment.first
                seen.append(((partition, offset), (segment.plan_ms, ordinal)))
    return seen


def test_a_small_batch_is_one_task_and_places_every_record_as_the_plan_log_does():
    groups = task_groups(plan_segments(START, PLANS))
    assert len(groups) == 1  # 20 records: one task, not one per plan and partition
    seen = read_as_the_tasks_do(groups)
    assert len(seen) == len(dict(seen))  # no record read twice
    assert dict(seen) == expected_placement()


def test_a_large_batch_is_one_task_per_partition_with_the_same_placement():
    groups = task_groups(plan_segments(START, PLANS), one_task=5)
    assert [sorted({s.partition for s in g}) for g in groups] == [[0], [1], [2]]
    seen = read_as_the_tasks_do(groups)
    assert len(seen) == len(dict(seen))
    assert dict(seen) == expected_placement()


def test_plans_without_records_make_no_task():
    assert task_groups(plan_segments(START, [Plan(4, 1_000, dict(START))])) == []
