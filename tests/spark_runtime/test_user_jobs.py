"""User jobs (docs/JOBS.md) on one in-process SparkSession: the example jobs of jobs/examples give
the results computed here in plain Python from their input, through a standby's promotion and a
replayed batch, with malformed entries in the dead-letter stream; the dry run refuses broken
jobs with a message naming the operator."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from spark_runtime import generators, keys, user_plan
from spark_runtime.checkpoint_seed import seed_checkpoint
from spark_runtime.jobdef import (
    Append,
    JobDefinition,
    Operator,
    Upsert,
    load_definition,
    registered_path,
    snapshot_source,
)
from spark_runtime.runtime import PRIMARY, STANDBY, StageRuntime
from spark_runtime.topology import CHAINED, FUSED, compile_stages
from tests.spark_runtime.checkpoints import forget_last_commits

pytestmark = pytest.mark.spark

PROJECT_JOBS = Path(__file__).resolve().parents[2] / "jobs"


@pytest.fixture(scope="module")
def spark():
    from spark_runtime.config import build_session

    session = build_session("backstop-tests-user-jobs")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory):
    """A jobs directory with the examples, each registered as version 1 (snapshots written as
    registration writes them)."""
    directory = tmp_path_factory.mktemp("jobs")
    shutil.copytree(PROJECT_JOBS / "examples", directory / "examples")
    for name in ("activity", "server_errors"):
        path = registered_path(name, 1, directory)
        path.parent.mkdir(parents=True)
        path.write_text(snapshot_source(f"examples.clickstream:{name}", directory))
    old = os.environ.get("BACKSTOP_JOBS_DIR")
    os.environ["BACKSTOP_JOBS_DIR"] = str(directory)
    yield directory
    if old is None:
        os.environ.pop("BACKSTOP_JOBS_DIR")
    else:
        os.environ["BACKSTOP_JOBS_DIR"] = old


def topology_of(name, jobs_dir):
    from spark_runtime.jobdef import resolve_topology

    return resolve_topology(f"{name}@1", jobs_dir)


def runtime(spark, client, redis_url, job, topology, path, role, max_records, chaining=CHAINED):
    (stage,) = compile_stages(topology, chaining, job=job)
    rt = StageRuntime(
        spark, client, job, topology, stage, role, redis_url, str(path), max_records=max_records
    )
    rt.start()
    return rt


def input_clicks(client, job):
    """The well-formed input entries as plain dicts (the test's own parsing, not Backstop's)."""
    clicks = []
    for _, fields in client.xrange(keys.input_stream(job)):
        try:
            ts = int(fields["ts"])
            click = {
                "id": fields["id"],
                "ts": ts,
                "user": fields["user"],
                "page": fields["page"],
                "dwell_ms": int(fields["dwell_ms"]),
                "status": int(fields["status"]),
            }
        except (KeyError, ValueError):
            continue
        clicks.append(click)
    return clicks


def iso(ms: int) -> str:
    """Epoch ms as the results write timestamps."""
    seconds = dt.datetime.fromtimestamp(ms // 1000, tz=dt.UTC)
    return f"{seconds:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def expected_activity(clicks):
    """Per user and 10-second window: clicks, total and longest dwell (computed here)."""
    cells = defaultdict(lambda: [0, 0, 0])
    for c in clicks:
        cell = cells[f"{c['user']}|{iso(c['ts'] - c['ts'] % 10_000)}"]
        cell[0] += 1
        cell[1] += c["dwell_ms"]
        cell[2] = max(cell[2], c["dwell_ms"])
    return {k: {"clicks": a, "dwell_ms": b, "longest_ms": m} for k, (a, b, m) in cells.items()}


def written_activity(client, job):
    import json

    return {k: json.loads(v) for k, v in client.hgetall(keys.results(job)).items()}


def test_activity_matches_plain_python_through_a_promotion(
    spark, redis_conn, redis_url, job, tmp_path, jobs_dir
):
    topology = topology_of("activity", jobs_dir)
    generators.generate(
        redis_conn, job, "activity@1", count=1500, rate=3000, seed=1, malformed_every=97
    )
    # Different batch sizes: the replicas cut the input into different batches.
    primary = runtime(spark, redis_conn, redis_url, job, topology, tmp_path / "p", PRIMARY, 300)
    standby = runtime(spark, redis_conn, redis_url, job, topology, tmp_path / "s", STANDBY, 450)
    try:
        primary.process_all_available()
        primary.stop()  # the primary dies; the input goes on
        generators.generate(
            redis_conn, job, "activity@1", count=900, rate=3000, seed=2, id_prefix="g"
        )
        standby.process_all_available()
        assert len(standby.gate.buffer) > 0
        standby.gate.promote()
        generators.generate(
            redis_conn, job, "activity@1", count=300, rate=3000, seed=3, id_prefix="h"
        )
        standby.process_all_available()
    finally:
        standby.stop()
        primary.stop()
    clicks = input_clicks(redis_conn, job)
    assert written_activity(redis_conn, job) == expected_activity(clicks)
    # The job's own reference function agrees (what the benchmark compares with).
    definition = topology.job
    entries = redis_conn.xrange(keys.input_stream(job))
    assert user_plan.expected_results(definition, entries) == expected_activity(clicks)
    # Malformed entries went to the dead-letter stream, each once, with the reason.
    dead = redis_conn.xrange(keys.dead_letters(job))
    assert len(dead) == redis_conn.xlen(keys.input_stream(job)) - len(clicks) > 0
    assert all(fields["reason"] for _, fields in dead)


def test_activity_replayed_batch_changes_nothing(
    spark, redis_conn, redis_url, job, tmp_path, jobs_dir
):
    topology = topology_of("activity", jobs_dir)
    generators.generate(redis_conn, job, "activity@1", count=800, rate=4000, seed=4)
    first = runtime(
        spark, redis_conn, redis_url, job, topology, tmp_path / "c", PRIMARY, 200, FUSED
    )
    try:
        first.process_all_available()
    finally:
        first.stop()
    # As after a crash between writing the last two batches and committing them.
    forget_last_commits(tmp_path / "c" / "0")
    generators.generate(redis_conn, job, "activity@1", count=300, rate=4000, seed=5, id_prefix="g")
    again = runtime(
        spark, redis_conn, redis_url, job, topology, tmp_path / "c", PRIMARY, 200, FUSED
    )
    try:
        again.process_all_available()
    finally:
        again.stop()
    assert written_activity(redis_conn, job) == expected_activity(input_clicks(redis_conn, job))


def test_server_errors_appends_each_once_through_a_promotion(
    spark, redis_conn, redis_url, job, tmp_path, jobs_dir
):
    topology = topology_of("server_errors", jobs_dir)
    generators.generate(redis_conn, job, "server_errors@1", count=1200, rate=4000, seed=6)
    primary = runtime(spark, redis_conn, redis_url, job, topology, tmp_path / "p", PRIMARY, 250)
    standby = runtime(spark, redis_conn, redis_url, job, topology, tmp_path / "s", STANDBY, 400)
    try:
        primary.process_all_available()
        primary.stop()
        generators.generate(
            redis_conn, job, "server_errors@1", count=800, rate=4000, seed=7, id_prefix="g"
        )
        standby.process_all_available()
        standby.gate.promote()
        generators.generate(
            redis_conn, job, "server_errors@1", count=200, rate=4000, seed=8, id_prefix="h"
        )
        standby.process_all_available()
    finally:
        standby.stop()
        primary.stop()
    clicks = input_clicks(redis_conn, job)
    appended = [fields for _, fields in redis_conn.xrange(keys.output_stream(job))]
    assert sorted(f["key"] for f in appended) == sorted(
        c["id"] for c in clicks if c["status"] >= 500
    )
    by_id = {c["id"]: c for c in clicks}
    for fields in appended:
        click = by_id[fields["key"]]
        assert (fields["user"], fields["page"], fields["status"]) == (
            click["user"],
            click["page"],
            str(click["status"]),
        )
        assert fields["event_time"] == iso(click["ts"])


# --- the dry run --------------------------------------------------------------------------------


def _job(function, kind="map", output=None):
    return JobDefinition(
        name="broken",
        input_fields={"user": "string", "dwell_ms": "int"},
        operators=(
            Operator("in", "source"),
            Operator("step", kind, upstream=("in",), function=function),
            Operator("out", "sink", upstream=("step",)),
        ),
        output=output or Upsert(key=("user",)),
    )


def test_the_dry_run_passes_the_examples(spark, tmp_path):
    for name in ("activity", "server_errors"):
        definition = load_definition(f"examples.clickstream:{name}", PROJECT_JOBS)
        report = user_plan.dry_run(spark, definition, str(tmp_path / name))
        assert report["errors"] == [], report


def test_the_dry_run_names_the_operator_at_fault(spark, tmp_path):
    from pyspark.sql import functions as F

    unknown_column = _job(lambda df: df.select("user", "no_such_column"))
    report = user_plan.dry_run(spark, unknown_column, str(tmp_path / "a"))
    assert len(report["errors"]) == 1 and report["errors"][0].startswith("operator 'step':")
    assert "no_such_column" in report["errors"][0]

    not_a_frame = _job(lambda df: 42)
    report = user_plan.dry_run(spark, not_a_frame, str(tmp_path / "b"))
    assert report["errors"] == ["operator 'step': returned int, not a DataFrame"]

    missing_key = _job(lambda df: df.select("dwell_ms"))
    report = user_plan.dry_run(spark, missing_key, str(tmp_path / "c"))
    assert "key columns ['user']" in report["errors"][0]

    # An aggregation without a watermark cannot append final rows: Spark refuses it at start.
    counts = _job(
        lambda df: df.groupBy("user").agg(F.count(F.lit(1)).alias("n")),
        kind="aggregate",
        output=Append(key=("user",)),
    )
    report = user_plan.dry_run(spark, counts, str(tmp_path / "d"))
    assert len(report["errors"]) == 1 and report["errors"][0].startswith("operator 'step':")
    assert "append mode" in report["errors"][0]


def test_a_stateful_operators_parallelism_is_its_number_of_state_partitions(
    spark, redis_conn, redis_url, job, tmp_path, jobs_dir
):
    """activity with `parallelism=3` on per_window: its state is kept in 3 partitions (the
    checkpoint's state store has one directory per partition) and the results are unchanged.
    The session's own setting is left as it was. A version with another parallelism started on
    a copy of that checkpoint (an upgrade's new version) runs on its own number: the copy's
    state is repartitioned first, and the results stay exact."""
    example = topology_of("activity", jobs_dir)
    operators = tuple(
        dataclasses.replace(op, parallelism=3) if op.name == "per_window" else op
        for op in example.job.operators
    )
    topology = dataclasses.replace(example.job, operators=operators).to_topology(1)
    session_value = spark.conf.get("spark.sql.shuffle.partitions")
    generators.generate(redis_conn, job, "activity@1", count=600, rate=3000, seed=6)
    rt = runtime(spark, redis_conn, redis_url, job, topology, tmp_path / "p3", PRIMARY, 300)
    try:
        assert spark.conf.get("spark.sql.shuffle.partitions") == session_value
        rt.process_all_available()
    finally:
        rt.stop()
    assert written_activity(redis_conn, job) == expected_activity(input_clicks(redis_conn, job))
    (aggregation_state,) = (tmp_path / "p3" / "0" / "state").iterdir()
    partitions = sorted(p.name for p in aggregation_state.iterdir() if p.name.isdigit())
    assert partitions == ["0", "1", "2"]
    assert recorded_partitions_of(tmp_path / "p3") == "3"

    seed_checkpoint(str(tmp_path / "p3"), str(tmp_path / "new"), 1)
    generators.generate(redis_conn, job, "activity@1", count=300, rate=3000, seed=7, id_prefix="g")
    resumed = runtime(spark, redis_conn, redis_url, job, example, tmp_path / "new", PRIMARY, 300)
    try:
        resumed.process_all_available()
    finally:
        resumed.stop()
    assert resumed.state_partitions == {"0": "repartitioned from 3 to 1 partitions"}
    assert written_activity(redis_conn, job) == expected_activity(input_clicks(redis_conn, job))
    assert recorded_partitions_of(tmp_path / "new") == "1"

    # Its own checkpoint after a crash before the last commit: Spark repartitions only a
    # committed batch, so the query keeps its 3 partitions (and replays the batch exactly).
    shutil.copytree(tmp_path / "p3", tmp_path / "crashed")
    forget_last_commits(tmp_path / "crashed" / "0", count=1)
    restarted = runtime(spark, redis_conn, redis_url, job, example, tmp_path / "crashed",
                        PRIMARY, 300)  # fmt: skip
    try:
        restarted.process_all_available()
    finally:
        restarted.stop()
    assert restarted.state_partitions == {
        "0": "kept 3 partitions, not 1: its last batch is not committed"
    }
    assert written_activity(redis_conn, job) == expected_activity(input_clicks(redis_conn, job))
    assert recorded_partitions_of(tmp_path / "crashed") == "3"


def recorded_partitions_of(checkpoint: Path) -> str:
    """The state partitions the newest offsets entry of query 0 records (read here, not with
    Backstop's reader)."""
    import json

    offsets = checkpoint / "0" / "offsets"
    newest = max((p for p in offsets.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return json.loads(newest.read_text().splitlines()[1])["conf"]["spark.sql.shuffle.partitions"]
