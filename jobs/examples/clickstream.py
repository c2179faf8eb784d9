"""Two user jobs on a clickstream: the worked example of docs/JOBS.md.

Each input entry is one click: the `user`, the `page`, how long the user stayed (`dwell_ms`)
and the HTTP `status` of the page. Backstop adds `id` and `event_time` to every row.

- `activity`: per user and 10-second window of event time, the clicks, the total and the
  longest dwell time; upserted into the results hash by (user, window start). A 30-second
  watermark bounds the state: windows older than that are dropped from it.
- `server_errors`: every click that got a 5xx, appended to the output stream once (by id).

Register them with `manage.py register_topology examples.clickstream:activity` (and
`examples.clickstream:server_errors`); see docs/JOBS.md.
"""

from collections import defaultdict

from pyspark.sql import functions as F

from spark_runtime.jobdef import Append, JobDefinition, Operator, Upsert

WINDOW = "10 seconds"
USERS = [f"u{i:02d}" for i in range(20)]
PAGES = ["home", "search", "item", "cart", "checkout", "help", "account", "deals"]


def click(rng):
    """One click's payload, from a seeded random.Random (the demo's and the tests' input)."""
    return {
        "user": rng.choice(USERS),
        "page": rng.choice(PAGES),
        "dwell_ms": rng.randint(100, 5000),
        "status": rng.choice([200] * 9 + [503]),
    }


# --- activity: a windowed aggregation, upserted -----------------------------------------------


def keep_real_pages(clicks):
    """Drop the health-check noise: only clicks with a page and a positive dwell time."""
    return clicks.where((F.col("page") != "") & (F.col("dwell_ms") > 0))


def activity_per_window(clicks):
    """Clicks and dwell time per user and 10-second window; the watermark bounds the state."""
    return (
        clicks.withWatermark("event_time", "30 seconds")
        .groupBy("user", F.window("event_time", WINDOW).alias("window"))
        .agg(
            F.count(F.lit(1)).alias("clicks"),
            F.sum("dwell_ms").alias("dwell_ms"),
            F.max("dwell_ms").alias("longest_ms"),
        )
        .select(
            "user",
            F.col("window.start").alias("window_start"),
            "clicks",
            "dwell_ms",
            "longest_ms",
        )
    )


def activity_reference(rows):
    """The same results in plain Python: {(user, window start): {...}}."""
    per_key = defaultdict(lambda: {"clicks": 0, "dwell_ms": 0, "longest_ms": 0})
    for row in rows:
        if not row["page"] or row["dwell_ms"] <= 0:
            continue
        event_time = row["event_time"]
        start = event_time.replace(microsecond=0, second=event_time.second - event_time.second % 10)
        cell = per_key[(row["user"], start)]
        cell["clicks"] += 1
        cell["dwell_ms"] += row["dwell_ms"]
        cell["longest_ms"] = max(cell["longest_ms"], row["dwell_ms"])
    return dict(per_key)


activity = JobDefinition(
    name="activity",
    description="Clicks and dwell time per user and 10-second window of a clickstream.",
    input_fields={"user": "string", "page": "string", "dwell_ms": "int", "status": "int"},
    operators=(
        Operator("clicks", "source"),
        Operator("real_pages", "filter", upstream=("clicks",), function=keep_real_pages),
        Operator(
            "per_window",
            "window_aggregate",
            upstream=("real_pages",),
            function=activity_per_window,
            cpu=0.5,
            mem=512,
        ),
        Operator("results", "sink", upstream=("per_window",)),
    ),
    output=Upsert(key=("user", "window_start")),
    generate=click,
    reference=activity_reference,
)


# --- server_errors: a filter, appended ---------------------------------------------------------


def errors_only(clicks):
    """The clicks answered with a server error."""
    return clicks.where(F.col("status") >= 500).select("id", "user", "page", "status", "event_time")


def server_errors_reference(rows):
    """The same records in plain Python: {id: {...}}."""
    return {
        row["id"]: {
            "user": row["user"],
            "page": row["page"],
            "status": row["status"],
            "event_time": row["event_time"],
        }
        for row in rows
        if row["status"] >= 500
    }


server_errors = JobDefinition(
    name="server_errors",
    description="Every click answered with a 5xx, once.",
    input_fields={"user": "string", "page": "string", "dwell_ms": "int", "status": "int"},
    operators=(
        Operator("clicks", "source"),
        Operator("errors", "filter", upstream=("clicks",), function=errors_only),
        Operator("stream", "sink", upstream=("errors",)),
    ),
    output=Append(key=("id",)),
    generate=click,
    reference=server_errors_reference,
)
