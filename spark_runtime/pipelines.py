"""What each operator of each topology does in Spark, and how its output rows become Redis writes.

An operator's `build` turns a streaming DataFrame with the columns `pos`, `id`, `ts` and its input
fields into its output DataFrame, which always keeps `pos` (the input offset the row derives from,
for stateful rows the highest one) and `ts` (the event time, for stateful rows the latest one).
When an operator ends a query, `to_channel` (intermediate stream) or `to_outputs` (final
outputs) turns each output row (a dict) into records for the idempotent sinks of `sink.py`.

Ground truth for every topology is documented in docs/DATA_PLANE.md; tests recompute it in plain
Python from the input stream.

State stays bounded. Every operator that keys its state by event time (topn's windows, traffic's
seconds) declares an event-time watermark (`watermark_seconds` behind the latest event time,
default 30 s): Spark drops the state of a window once the watermark passes its end, and input
that late is dropped. Wordcount's and shuffle's state is one row per word or key, over all
time: bounded by the vocabulary or key count, with no event time to expire it by.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from spark_runtime.sink import HashRow, StreamRecord, version
from spark_runtime.topology import (
    OUT_CHANNEL,
    RESULTS_CHANNEL,
    SOURCE,
    OperatorSpec,
    Topology,
    runs_as_one,
)

DEFAULT_WATERMARK_S = 30  # how far behind the latest event time a window's state is kept


def _with_event_time(df, op: OperatorSpec, event_time):
    """`df` with an `event_time` timestamp column carrying the operator's watermark."""
    delay = int(op.params.get("watermark_seconds", DEFAULT_WATERMARK_S))
    return df.withColumn("event_time", event_time).withWatermark("event_time", f"{delay} seconds")


@dataclass(frozen=True)
class OperatorPlan:
    """The Spark side of one operator."""

    input_fields: str
    build: Callable
    output_mode: str  # "append" for stateless operators, "update" for stateful ones
    to_channel: Callable[[dict], StreamRecord] | None = None
    to_outputs: Callable[[dict], list[tuple[str, object]]] | None = None


# --- wordcount -----------------------------------------------------------------------------


def _split_build(df, op: OperatorSpec):
    from pyspark.sql import functions as F

    words = df.select(
        "pos", "id", "ts", F.posexplode(F.split(F.lower(F.col("text")), r"\s+")).alias("k", "word")
    )
    return words.where(F.col("word") != "")


def _split_channel(row: dict) -> StreamRecord:
    fields = {"id": f"{row['id']}-{row['k']}", "ts": row["ts"], "word": row["word"]}
    return StreamRecord(version(row["pos"], row["k"]), fields)


def _count_build(df, op: OperatorSpec):
    from pyspark.sql import functions as F

    return df.groupBy("word").agg(
        F.count(F.lit(1)).alias("count"), F.max("pos").alias("pos"), F.max("ts").alias("ts")
    )


def _count_outputs(row: dict):
    return [(RESULTS_CHANNEL, HashRow(version(row["pos"]), row["word"], str(row["count"])))]


# --- topn ----------------------------------------------------------------------------------


def _window_count_build(df, op: OperatorSpec):
    from pyspark.sql import functions as F

    width = int(op.params.get("window_seconds", 10))
    events = _with_event_time(df, op, F.timestamp_millis("ts"))
    counts = events.groupBy(F.window("event_time", f"{width} seconds").alias("w"), "item").agg(
        F.count(F.lit(1)).alias("count"), F.max("pos").alias("pos"), F.max("ts").alias("ts")
    )
    # The window's start in epoch ms: tumbling windows align to the epoch (ts - ts % width).
    start = F.unix_millis("w.start").alias("window")
    return counts.select(start, F.lit(width).alias("width"), "item", "count", "pos", "ts")


def _window_count_channel(row: dict) -> StreamRecord:
    fields = {
        "id": f"{row['window']}:{row['item']}:{row['count']}",
        "ts": row["ts"],
        "window": row["window"],
        "width": row["width"],
        "item": row["item"],
        "count": row["count"],
    }
    return StreamRecord(version(row["pos"]), fields)


def _topn_build(df, op: OperatorSpec):
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    n = int(op.params.get("n", 5))
    delay_ms = int(op.params.get("watermark_seconds", DEFAULT_WATERMARK_S)) * 1000

    def top_n(key, pdfs, state):
        import pandas as pd

        if state.hasTimedOut:
            # The watermark is a full delay past the point where window_count stopped updating
            # this window (its own watermark passed the window's end): its top-N is final.
            state.remove()
            return
        counts = json.loads(state.get[0]) if state.exists else {}
        pos = ts = width_s = 0
        for pdf in pdfs:
            width_s = max(width_s, int(pdf["width"].max()))
            # Counts of a (window, item) only grow; keeping the maximum makes replays harmless.
            for item, count in zip(pdf["item"], pdf["count"], strict=True):
                counts[item] = max(counts.get(item, 0), int(count))
            pos = max(pos, int(pdf["pos"].max()))
            ts = max(ts, int(pdf["ts"].max()))
        state.update((json.dumps(counts),))
        expires = int(key[0]) + width_s * 1000 + delay_ms
        state.setTimeoutTimestamp(max(expires, state.getCurrentWatermarkMs() + 1))
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        yield pd.DataFrame({"window": [key[0]], "top": [json.dumps(top)], "pos": [pos], "ts": [ts]})

    events = _with_event_time(df, op, F.timestamp_millis("ts"))
    return events.groupBy("window").applyInPandasWithState(
        top_n,
        "window long, top string, pos long, ts long",
        "counts string",
        "update",
        GroupStateTimeout.EventTimeTimeout,
    )


def _topn_outputs(row: dict):
    return [(RESULTS_CHANNEL, HashRow(version(row["pos"]), str(row["window"]), row["top"]))]


def _window_topn_build(df, window_op: OperatorSpec, topn_op: OperatorSpec):
    """window_count and topn as one stateful operator, for a query that runs both: Spark cannot
    chain an update-mode aggregation into a state function, and as two queries every result
    waited for a trigger of each (topn's output gap after a failover was two triggers long).

    One state per tumbling window (the item counts, as topn keeps them): the same results as
    the two operators, from the same input, in one batch and one shuffle. Spark drops input
    older than the watermark (window_count's) before the state function sees it, so a window's
    state can go once the watermark has passed its end: no input for it can come any more."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    width_ms = int(window_op.params.get("window_seconds", 10)) * 1000
    n = int(topn_op.params.get("n", 5))

    def window_top_n(key, pdfs, state):
        import pandas as pd

        if state.hasTimedOut:
            state.remove()
            return
        counts = json.loads(state.get[0]) if state.exists else {}
        pos = ts = 0
        for pdf in pdfs:
            # Spark commits the state with the input offsets it read: no batch is counted twice.
            for item, count in pdf["item"].value_counts().items():
                counts[item] = counts.get(item, 0) + int(count)
            pos = max(pos, int(pdf["pos"].max()))
            ts = max(ts, int(pdf["ts"].max()))
        state.update((json.dumps(counts),))
        ends = int(key[0]) + width_ms
        state.setTimeoutTimestamp(max(ends, state.getCurrentWatermarkMs() + 1))
        top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        yield pd.DataFrame({"window": [key[0]], "top": [json.dumps(top)], "pos": [pos], "ts": [ts]})

    events = _with_event_time(df, window_op, F.timestamp_millis("ts"))
    # The tumbling window's start in epoch ms, as window_count's `window` (aligned to the epoch).
    windowed = events.withColumn("window", F.col("ts") - F.col("ts") % F.lit(width_ms))
    return windowed.groupBy("window").applyInPandasWithState(
        window_top_n,
        "window long, top string, pos long, ts long",
        "counts string",
        "update",
        GroupStateTimeout.EventTimeTimeout,
    )


# --- traffic -------------------------------------------------------------------------------


def _join_build(df, op: OperatorSpec):
    from pyspark.sql import functions as F

    # Both sources share the input stream (field `kind`); the join pairs the speed and the flow
    # measurement of one sensor lane in one second and emits the pair once both have arrived.
    second = F.floor(F.col("ts") / 1000).cast("long")
    keyed = _with_event_time(df.withColumn("second", second), op, F.timestamp_seconds(second))
    # Grouping by `event_time` (the second as a timestamp) lets the watermark expire the state.
    joined = keyed.groupBy("sensor", "lane", "event_time", "second").agg(
        F.max(F.when(F.col("kind") == "speed", F.col("value"))).alias("speed"),
        F.max(F.when(F.col("kind") == "flow", F.col("value"))).alias("flow"),
        F.max("pos").alias("pos"),
        F.max("ts").alias("ts"),
    )
    complete = joined.where(F.col("speed").isNotNull() & F.col("flow").isNotNull())
    return complete.drop("event_time")


def _join_channel(row: dict) -> StreamRecord:
    fields = {
        "id": f"{row['sensor']}:{row['lane']}:{row['second']}",
        "ts": row["ts"],
        "sensor": row["sensor"],
        "lane": row["lane"],
        "second": row["second"],
        "speed": row["speed"],
        "flow": row["flow"],
    }
    return StreamRecord(version(row["pos"]), fields)


def _location_build(df, op: OperatorSpec):
    from pyspark.sql import functions as F

    events = _with_event_time(df, op, F.timestamp_seconds("second"))
    per_location = events.groupBy("sensor", "event_time", "second").agg(
        F.sum("speed").alias("speed_sum"),
        F.count(F.lit(1)).alias("lanes"),
        F.sum("flow").alias("total_flow"),
        F.max("pos").alias("pos"),
        F.max("ts").alias("ts"),
    )
    return per_location.drop("event_time")


def _location_outputs(row: dict):
    value = {
        "avg_speed": round(row["speed_sum"] / row["lanes"], 3),
        "total_flow": round(row["total_flow"], 3),
        "lanes": row["lanes"],
    }
    field = f"{row['sensor']}|{row['second']}"
    return [(RESULTS_CHANNEL, HashRow(version(row["pos"]), field, json.dumps(value)))]


# --- shuffle -------------------------------------------------------------------------------


def _assign_build(df, op: OperatorSpec):
    from pyspark.sql import functions as F

    n_keys = int(op.params.get("keys", 100))
    key = F.concat(F.lit("k"), (F.crc32(F.col("id")) % F.lit(n_keys)).cast("string"))
    return df.select("pos", "id", "ts", key.alias("key"), "value")


def _assign_channel(row: dict) -> StreamRecord:
    fields = {"id": f"{row['id']}-0", "ts": row["ts"], "key": row["key"], "value": row["value"]}
    return StreamRecord(version(row["pos"]), fields)


def _shuffle_aggregate_build(df, op: OperatorSpec):
    from pyspark.sql.streaming.state import GroupStateTimeout

    selectivity = float(op.params.get("selectivity", 0.01))
    period = max(1, round(1 / selectivity))

    def aggregate(key, pdfs, state):
        import pandas as pd

        count, total = state.get if state.exists else (0, 0)
        batch = pd.concat(list(pdfs)).sort_values("pos")
        out = {c: [] for c in ("kind", "key", "count", "sum", "id", "pos", "ts")}

        def emit(kind, rid, pos, ts):
            for col, val in zip(out, (kind, key[0], count, total, rid, pos, ts), strict=True):
                out[col].append(val)

        for rid, value, pos, ts in zip(
            batch["id"], batch["value"], batch["pos"], batch["ts"], strict=True
        ):
            count += 1
            total += int(value)
            # Every `period`-th record of a key emits an output: selectivity = 1 / period.
            if count % period == 0:
                emit("out", rid, int(pos), int(ts))
        emit("state", "", int(batch["pos"].max()), int(batch["ts"].max()))
        state.update((count, total))
        yield pd.DataFrame(out)

    return df.groupBy("key").applyInPandasWithState(
        aggregate,
        "kind string, key string, count long, sum long, id string, pos long, ts long",
        "count long, sum long",
        "update",
        GroupStateTimeout.NoTimeout,
    )


def _shuffle_outputs(row: dict):
    if row["kind"] == "out":
        fields = {
            "id": f"{row['id']}-0",
            "ts": row["ts"],
            "key": row["key"],
            "count": row["count"],
            "sum": row["sum"],
        }
        return [(OUT_CHANNEL, StreamRecord(version(row["pos"]), fields))]
    value = json.dumps({"count": row["count"], "sum": row["sum"]})
    return [(RESULTS_CHANNEL, HashRow(version(row["pos"]), row["key"], value))]


PLANS: dict[tuple[str, str], OperatorPlan] = {
    ("wordcount", "split"): OperatorPlan("text", _split_build, "append", to_channel=_split_channel),
    ("wordcount", "count"): OperatorPlan("word", _count_build, "update", to_outputs=_count_outputs),
    ("topn", "window_count"): OperatorPlan(
        "item", _window_count_build, "update", to_channel=_window_count_channel
    ),
    ("topn", "topn"): OperatorPlan(
        "window:int,width:int,item,count:int", _topn_build, "update", to_outputs=_topn_outputs
    ),
    ("traffic", "join"): OperatorPlan(
        "kind,sensor,lane:int,value:double", _join_build, "update", to_channel=_join_channel
    ),
    ("traffic", "location_aggregate"): OperatorPlan(
        "sensor,lane:int,second:int,speed:double,flow:double",
        _location_build,
        "update",
        to_outputs=_location_outputs,
    ),
    ("shuffle", "assign_keys"): OperatorPlan(
        "value:int", _assign_build, "append", to_channel=_assign_channel
    ),
    ("shuffle", "aggregate"): OperatorPlan(
        "key,value:int", _shuffle_aggregate_build, "update", to_outputs=_shuffle_outputs
    ),
}


# Consecutive stateful operators that one query can run as one operator (its build takes their
# OperatorSpecs in order): `topology.stage_spec` puts them in one query when a stage holds both.
FUSED_PLANS: dict[tuple[str, tuple[str, ...]], OperatorPlan] = {
    ("topn", ("window_count", "topn")): OperatorPlan(
        "item", _window_topn_build, "update", to_outputs=_topn_outputs
    ),
}


def plan_for(topology: str, operator: str) -> OperatorPlan:
    """The Spark plan of `operator` in `topology`."""
    try:
        return PLANS[(topology, operator)]
    except KeyError:
        raise KeyError(f"no Spark plan for operator {operator!r} of {topology!r}") from None


def fused_plan(topology: Topology, operators: tuple[str, ...]) -> OperatorPlan | None:
    """The one plan that runs `operators` (consecutive, each reading the one before) as one
    operator of a built-in topology, or None (a user job's operators have none)."""
    if not runs_as_one(topology, operators):
        return None
    return FUSED_PLANS[(topology.name, tuple(operators))]


def segment_plans(topology: Topology, operators: tuple[str, ...]):
    """The plans that build a query running `operators` in order, each with the OperatorSpecs
    its build takes: one fused plan where there is one for all of them, else one per operator."""
    fused = fused_plan(topology, operators)
    if fused is not None:
        return [(fused, tuple(topology.operator(name) for name in operators))]
    return [(plan_for(topology.name, name), (topology.operator(name),)) for name in operators]


def input_field_names(topology: Topology) -> tuple[str, ...]:
    """The payload fields a job's input records carry: a user job's declared `input_fields`, or
    those the built-in topology's first processing operator reads."""
    if topology.job is not None:
        return tuple(topology.job.input_fields)
    first = next(op for op in topology.topological_order() if op.kind != SOURCE)
    fields = segment_plans(topology, (first.name,))[0][0].input_fields
    return tuple(part.split(":")[0].strip() for part in fields.split(",") if part.strip())
