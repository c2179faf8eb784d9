"""User jobs (docs/JOBS.md) on one in-process SparkSession: the example jobs of jobs/examples give
the results computed here in plain Python from their input, through a standby's promotion and a
replayed batch, with malformed entries in the dead-letter stream; the dry run refuses broken
jobs with a message naming the operator."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from spark_runtime import external_io, generators, keys, user_plan
from spark_runtime.checkpoint_seed import seed_checkpoint
from spark_runtime.external_io import ExternalIO, KafkaSink, KafkaSource
from spark_runtime.jobdef import (
    Append,
    JobDefinition,
    Operator,
    Upsert,
    load_definition,
    registered_path,
    snapshot_source,
)
from spark_runtime.kafka_plan import position as kafka_position
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


# --- on Kafka ----------------------------------------------------------------------------------


def test_a_batch_of_a_kafka_input_is_versioned_by_its_plan(tmp_path):
    """A Kafka input's offset is a plan index (spark_runtime/kafka_plan.py): the batch's version
    is at or above every position of that plan's records and below the next plan's."""
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "3").write_text('v1\n{"batchWatermarkMs":0}\n{"plan": 7, "end": {"0": 12}}\n')
    (offsets / "4").write_text('v1\n{"batchWatermarkMs":0}\n{"id": "1700000000123-4"}\n')
    plans = {7: 1_700_000_000_500, 8: 1_700_000_000_501}
    version = user_plan.batch_version(str(tmp_path), 3, plans.__getitem__)
    assert version == f"{1_700_000_000_500 * 1_000_000 + 999_999:020d}000000"
    assert kafka_position(plans[7], 99_999) <= int(version[:20]) < kafka_position(plans[8], 0)
    # A Redis stream's offset is the batch's last entry id, as before.
    assert user_plan.batch_version(str(tmp_path), 4) == f"{1_700_000_000_123_000_004:020d}000000"
    with pytest.raises(ValueError, match="Kafka plan"):
        user_plan.batch_version(str(tmp_path), 3)


def kafka_topics(bootstrap: str) -> tuple[str, str]:
    """A fresh input topic (3 partitions) and output topic (2), with the dead-letter and marks
    topics a launch creates."""
    name = f"t{uuid.uuid4().hex[:8]}"
    wanted = [
        NewTopic(f"{name}.in", 3, 1),
        NewTopic(f"{name}.in.dead", 1, 1),
        NewTopic(f"{name}.out", 2, 1),
        NewTopic(f"{name}.out.marks", 1, 1, config={"cleanup.policy": "compact"}),
    ]
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need it alive
    for future in admin.create_topics(wanted).values():
        future.result(30)
    return f"{name}.in", f"{name}.out"


def topic_records(bootstrap: str, topic: str) -> list[dict]:
    """Every committed record's JSON value, read with a read_committed consumer."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.partition.eof": True,
         "isolation.level": "read_committed", "enable.auto.commit": False}
    )  # fmt: skip
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    done, out = set(), []
    while len(done) < len(partitions):
        msg = consumer.poll(10.0)
        assert msg is not None, f"{topic} gave nothing for 10 s"
        if msg.error() is not None:
            assert msg.error().code() == KafkaError._PARTITION_EOF
            done.add(msg.partition())
        else:
            out.append(json.loads(msg.value()))
    consumer.close()
    return out


def test_activity_reads_kafka_and_writes_kafka_in_batches_versioned_by_plan(
    spark, redis_conn, redis_url, job, tmp_path, jobs_dir, kafka_broker
):
    bootstrap = kafka_broker.bootstrap_servers
    source, sink = kafka_topics(bootstrap)
    external_io.save(
        redis_conn, job, ExternalIO(KafkaSource(source, bootstrap), KafkaSink(sink, bootstrap))
    )
    topology = topology_of("activity", jobs_dir)
    generators.generate_to_kafka(bootstrap, source, "activity@1", count=700, rate=1e6, seed=9)
    rt = runtime(spark, redis_conn, redis_url, job, topology, tmp_path / "p", PRIMARY, 250)
    try:
        rt.process_all_available()
        generators.generate_to_kafka(
            bootstrap, source, "activity@1", count=300, rate=1e6, seed=10, id_prefix="g"
        )
        rt.process_all_available()
    finally:
        rt.stop()
    clicks = [{**r, "ts": int(r["ts"])} for r in topic_records(bootstrap, source)]
    expected = expected_activity(clicks)
    assert written_activity(redis_conn, job) == expected
    newest: dict[str, tuple[str, dict]] = {}
    for record in topic_records(bootstrap, sink):
        if record["key"] not in newest or record["version"] > newest[record["key"]][0]:
            newest[record["key"]] = (record["version"], json.loads(record["value"]))
    assert {key: value for key, (_v, value) in newest.items()} == expected
    # Every version names a plan of the shared plan log (its creation time, ms).
    plan_ms = {json.loads(raw)["ms"] for raw in redis_conn.lrange(keys.kafka_plans(job), 0, -1)}
    versions = redis_conn.hgetall(keys.result_versions(job)).values()
    assert versions and {int(v[:20]) // 1_000_000 for v in versions} <= plan_ms


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
