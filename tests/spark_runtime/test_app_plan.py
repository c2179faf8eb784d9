"""The stateful operators of an app's queries, read from their physical plans
(spark_runtime/app_plan.py), the topology's operators they become, and the sources' lag the
progress record keeps.

The plans under plans/ were printed by real streaming queries (PySpark 4, `explainInternal`
after a batch; the windowed one's long window expression shortened): an aggregation, a
windowed aggregation, a deduplication, a stream-stream join and applyInPandasWithState. The
slow test runs those queries again and checks that their live plans still parse the same."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_runtime.app_plan import FoundOperator, operator_specs, stateful_operators
from spark_runtime.apps import APP_OPERATOR, AppDefinition
from spark_runtime.progress import offset_lag, source_summary
from spark_runtime.topology import AGGREGATE, JOIN, STATEFUL, WINDOW_AGGREGATE

PLANS = Path(__file__).parent / "plans"


def found_in(plan: str, query: str) -> list[tuple]:
    return [(op.name, op.kind, op.node, op.op_id) for op in stateful_operators(plan, query)]


# Stored plan -> the operators found in it (name, kind, plan node, Spark's operator id).
EXPECTED = {
    # StateStoreRestore and StateStoreSave are one operator.
    "aggregate": [("q:aggregate", AGGREGATE, "StateStoreSave", 0)],
    "window": [("q:window-aggregate", WINDOW_AGGREGATE, "StateStoreSave", 0)],
    "deduplicate": [("q:deduplicate", AGGREGATE, "StreamingDeduplicate", 0)],
    "join": [("q:join", JOIN, "StreamingSymmetricHashJoin", 0)],
    "map_groups_with_state": [
        ("q:map-groups-with-state", STATEFUL, "FlatMapGroupsInPandasWithState", 0)
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_stateful_operators_of_real_plans(name):
    assert found_in((PLANS / f"{name}.txt").read_text(), "q") == EXPECTED[name]


def live_plan(frame, name: str, mode: str, tmp_path) -> str:
    """The physical plan text of a real query of `frame` after it read its input once."""
    query = (
        frame.writeStream.format("memory")
        .queryName(name)
        .outputMode(mode)
        .option("checkpointLocation", str(tmp_path / name))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert query.lastProgress is not None, f"{name} ran no batch"
    return query._jsq.explainInternal(False)


# Each query starts a SparkSession's worth of work: five of them took 402 s on this machine
# under the other engineers' load, so this runs outside the default suite.
@pytest.mark.slow
@pytest.mark.spark
def test_live_plans_parse_as_the_stored_ones(tmp_path):
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from spark_runtime.config import build_session

    spark = build_session("backstop-tests-app-plan")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    source = tmp_path / "in"
    source.mkdir()
    rows = [{"user": f"u{i % 3}", "ts": f"2026-11-28T10:00:{i:02d}Z"} for i in range(20)]
    (source / "a.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    clicks = spark.readStream.schema("user STRING, ts TIMESTAMP").json(str(source))
    watermarked = clicks.withWatermark("ts", "5 seconds")
    right = watermarked.select(F.col("user").alias("u2"), F.col("ts").alias("ts2"))

    def count(key, frames, state):
        yield pd.DataFrame({"user": [key[0]], "n": [sum(len(f) for f in frames)]})

    frames = {
        "aggregate": (clicks.groupBy("user").count(), "update"),
        "window": (watermarked.groupBy("user", F.window("ts", "10 seconds")).count(), "append"),
        "deduplicate": (watermarked.dropDuplicates(["user", "ts"]), "append"),
        "join": (
            watermarked.join(
                right, F.expr("user = u2 AND ts2 BETWEEN ts AND ts + interval 5 seconds")
            ),
            "append",
        ),
        "map_groups_with_state": (
            clicks.groupBy("user").applyInPandasWithState(
                count, "user STRING, n LONG", "n LONG", "update", GroupStateTimeout.NoTimeout
            ),
            "update",
        ),
    }
    try:
        for name, (frame, mode) in frames.items():
            assert found_in(live_plan(frame, name, mode, tmp_path), "q") == EXPECTED[name]
        # Two stateful operators in one query: in the order the data flows through them.
        chained = watermarked.dropDuplicates(["user", "ts"]).groupBy("user").count()
        plan = live_plan(chained, "chained", "update", tmp_path)
        assert [op[:3] for op in found_in(plan, "q")] == [
            ("q:deduplicate", AGGREGATE, "StreamingDeduplicate"),
            ("q:aggregate", AGGREGATE, "StateStoreSave"),
        ]
    finally:
        spark.stop()


def test_only_the_physical_plan_counts():
    # An extended explain also prints the logical plans, where a Deduplicate is not yet a
    # stateful operator: only the physical section is read.
    plan = (
        "== Analyzed Logical Plan ==\nDeduplicate [user#0]\n+- StreamingRelation x\n\n"
        "== Physical Plan ==\nWriteToDataSourceV2 MicroBatchWrite\n"
        "+- StreamingDeduplicate [user#0], state info [ opId = 0, ver = 1 ], 0\n"
        "   +- Exchange hashpartitioning(user#0, 2)\n"
    )
    assert [op.name for op in stateful_operators(plan, "q")] == ["q:deduplicate"]
    assert stateful_operators("== Physical Plan ==\n+- *(1) Project [a#1]\n", "q") == []


def test_two_of_a_kind_are_numbered_and_long_query_names_cut():
    plan = (
        "+- StateStoreSave [k#1], state info [ opId = 1 ], Append\n"
        "   +- StateStoreSave [k#0], state info [ opId = 0 ], Append\n"
    )
    name = "q" * 80
    found = stateful_operators(plan, name)
    assert [op.name for op in found] == [f"{'q' * 40}:aggregate-1", f"{'q' * 40}:aggregate-2"]
    assert [op.op_id for op in found] == [0, 1]
    assert all(len(op.name) <= 64 for op in found)


def test_found_operators_become_the_app_topologys_operators():
    found = [
        FoundOperator("large:deduplicate", AGGREGATE, "large", "StreamingDeduplicate", 0),
        FoundOperator("large:aggregate", AGGREGATE, "large", "StateStoreSave", 1),
        FoundOperator("totals:aggregate", AGGREGATE, "totals", "StateStoreSave", 0),
        FoundOperator("totals:aggregate", AGGREGATE, "totals", "StateStoreSave", 0),
    ]
    specs = operator_specs(found, after=APP_OPERATOR)
    topology = AppDefinition("spend", "apps/spend.py", "").to_topology(2, specs)
    assert topology.name == "spend@2"
    assert [(op.name, op.upstream) for op in topology.operators] == [
        (APP_OPERATOR, ()),
        ("large:deduplicate", (APP_OPERATOR,)),
        ("large:aggregate", ("large:deduplicate",)),
        ("totals:aggregate", (APP_OPERATOR,)),
    ]
    assert topology.downstream(APP_OPERATOR) == ("large:deduplicate", "totals:aggregate")
    with pytest.raises(ValueError, match="not a found operator"):
        FoundOperator.from_dict({"name": "x", "kind": "map"})
    assert FoundOperator.from_dict(found[0].to_dict()) == found[0]


def source(start, end, latest, metrics=None, description="src"):
    return SimpleNamespace(
        description=description,
        startOffset=start,
        endOffset=end,
        latestOffset=latest,
        metrics=metrics or {},
    )


def test_a_sources_lag_is_latest_less_end():
    kafka_end = {"clicks": {"0": 100, "1": 40}}
    kafka_latest = {"clicks": {"0": 130, "1": 45}}
    assert offset_lag(kafka_end, kafka_latest) == 35
    assert offset_lag({"logOffset": 3}, {"logOffset": 3}) == 0
    assert offset_lag("1764-0", "1765-0") is None  # a Redis stream id is not a count
    assert offset_lag({"logOffset": 3}, None) is None
    summary = json.loads(
        source_summary(
            [
                source(json.dumps({"clicks": {"0": 90}}), json.dumps(kafka_end), kafka_latest),
                source(None, '{"logOffset": 2}', None, {"maxOffsetsBehindLatest": "7"}),
                source(None, "1764-0", None, description="x" * 1000),
            ]
        )
    )
    assert [s["lag"] for s in summary] == [35, 7, None]
    assert summary[0]["end"] == json.dumps(kafka_end, sort_keys=True)
    assert len(summary[2]["source"]) == 240
    assert source_summary([]) == ""


def test_the_output_tail_keeps_the_newest_lines_in_order_and_gives_stdout_back(redis_conn):
    import sys

    from spark_runtime import keys
    from spark_runtime.app_output import LINE_CHARS, OutputTail, read_output

    keys.delete_job_keys(redis_conn, "tail-job")
    original = sys.stdout
    tail = OutputTail(redis_conn, "tail-job", "job-1")
    tail.start()
    try:
        sys.stdout.write("par")
        sys.stdout.write("tial\nsecond\n")
        print("x" * (LINE_CHARS + 10), file=sys.stderr)
        for n in range(keys.APP_OUTPUT_LINES):
            print(f"line {n}")
    finally:
        tail.stop()
    assert sys.stdout is original
    entries = read_output(redis_conn, "tail-job")
    assert len(entries) == keys.APP_OUTPUT_LINES  # capped: the oldest three are gone
    assert [e["line"] for e in entries] == [f"line {n}" for n in range(keys.APP_OUTPUT_LINES)]
    tail = OutputTail(redis_conn, "tail-job", "job-1")
    tail.add("stdout", "partial")
    tail.add("stderr", "y" * (LINE_CHARS + 10))
    tail.flush()
    newest = read_output(redis_conn, "tail-job", 2)
    assert [(e["stream"], len(e["line"])) for e in newest] == [
        ("stdout", 7),
        ("stderr", LINE_CHARS),
    ]
    keys.delete_job_keys(redis_conn, "tail-job")
