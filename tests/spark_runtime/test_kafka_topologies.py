"""Jobs on a real Kafka broker and real Spark queries: the Kafka source (shared plan log over
several partitions), the transactional Kafka sink, fencing at promotion, dead letters and
offsets lost to retention. Expected results are computed in plain Python from the topic."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from pyspark.errors import StreamingQueryException

from spark_runtime import external_io, generators, keys
from spark_runtime.external_io import ExternalIO, KafkaSink, KafkaSource
from spark_runtime.runtime import PRIMARY, STANDBY, StageRuntime
from spark_runtime.sink import FencedError, HashRow
from spark_runtime.topology import FUSED, PER_OPERATOR, compile_stages, get_topology
from tests.kafka_topics import committed
from tests.spark_runtime import truth

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    from spark_runtime.config import build_session

    session = build_session("backstop-kafka-tests")
    yield session
    session.stop()


@pytest.fixture
def topics(kafka_broker):
    """Fresh input, output, marks and dead-letter topics: (bootstrap, input, output)."""
    bootstrap = kafka_broker.bootstrap_servers
    name = f"t{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [
        NewTopic(f"{name}.in", 3, 1),
        NewTopic(f"{name}.in.dead", 1, 1),
        NewTopic(f"{name}.out", 2, 1),
        NewTopic(f"{name}.out.marks", 1, 1, config={"cleanup.policy": "compact"}),
    ]
    for future in admin.create_topics(wanted).values():
        future.result(30)
    return bootstrap, f"{name}.in", f"{name}.out"


def valid_input(bootstrap: str, topic: str, payload: list[str]) -> tuple[list[dict], int]:
    """The well-formed input records (JSON objects with every payload field) and how many were
    malformed."""
    good, bad = [], 0
    for _p, _o, _k, value in committed(bootstrap, topic):
        try:
            obj = json.loads(value)
        except ValueError:
            bad += 1
            continue
        if isinstance(obj, dict) and all(isinstance(obj.get(f), str) for f in payload):
            good.append(obj)
        else:
            bad += 1
    return good, bad


def output_audit(bootstrap: str, topic: str) -> tuple[dict, int]:
    """The newest value per key on the output topic, and how many (key, version) pairs were
    seen more than once."""
    seen = Counter()
    newest: dict[str, tuple[str, str]] = {}
    for _p, _o, key, value in committed(bootstrap, topic):
        record = json.loads(value)
        seen[(key, record["version"])] += 1
        current = newest.get(key.decode())
        if current is None or record["version"] > current[0]:
            newest[key.decode()] = (record["version"], record["value"])
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    return {k: int(v) for k, (_ver, v) in newest.items()}, duplicates


def runtime(spark, client, redis_url, job, stage, role, tmp_path, max_records=700):
    rt = StageRuntime(
        spark, client, job, get_topology("wordcount"), stage, role, redis_url,
        str(tmp_path / f"{stage.name}-{role}"), max_records=max_records,
    )  # fmt: skip
    rt.start()
    return rt


def save_io(client, job, bootstrap, source_topic, sink_topic, **source):
    external_io.save(
        client,
        job,
        ExternalIO(
            KafkaSource(source_topic, bootstrap, **source),
            KafkaSink(sink_topic, bootstrap) if sink_topic else None,
        ),
    )


def test_wordcount_reads_kafka_writes_kafka_exactly_and_dead_letters(
    spark, redis_conn, redis_url, job, tmp_path, topics
):
    bootstrap, source, sink = topics
    generators.generate_to_kafka(
        bootstrap, source, "wordcount", count=1500, rate=1e6, seed=1, malformed_every=50
    )
    save_io(redis_conn, job, bootstrap, source, sink)
    runtimes = [
        runtime(spark, redis_conn, redis_url, job, stage, PRIMARY, tmp_path)
        for stage in compile_stages(get_topology("wordcount"), PER_OPERATOR, job=job)
    ]
    try:
        for _ in range(2):
            for rt in runtimes:
                rt.process_all_available()
    finally:
        for rt in runtimes:
            rt.stop()
    entries, malformed = valid_input(bootstrap, source, ["text"])
    expected = truth.wordcount(entries)
    assert malformed == 30
    assert {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()} == expected
    got, duplicates = output_audit(bootstrap, sink)
    assert got == expected
    assert duplicates == 0
    assert redis_conn.xlen(keys.dead_letters(job)) == malformed
    assert redis_conn.hget(keys.stats(job), "dead:split") == str(malformed)
    letters = [json.loads(v) for *_ignored, v in committed(bootstrap, f"{source}.dead")]
    assert len(letters) == malformed
    assert {letter["reason"].split(":")[0] for letter in letters} >= {"value is not JSON"}


def test_a_promotion_on_kafka_fences_the_old_primary_at_the_broker_and_stays_exact(
    spark, redis_conn, redis_url, job, tmp_path, topics
):
    bootstrap, source, sink = topics
    (stage,) = compile_stages(get_topology("wordcount"), FUSED, job=job)
    generators.generate_to_kafka(bootstrap, source, "wordcount", count=1400, rate=1e6, seed=4)
    save_io(redis_conn, job, bootstrap, source, sink)
    # Different batch sizes: the replicas' batches cover different plans of the shared log.
    primary = runtime(spark, redis_conn, redis_url, job, stage, PRIMARY, tmp_path, 300)
    standby = runtime(spark, redis_conn, redis_url, job, stage, STANDBY, tmp_path, 450)
    try:
        primary.queries[0].processAllAvailable()
        primary.stop()  # it stays a zombie writer: its producer is still open
        generators.generate_to_kafka(
            bootstrap, source, "wordcount", count=900, rate=1e6, seed=5, id_prefix="g"
        )
        standby.process_all_available()
        assert len(standby.gate.buffer) > 0
        # The standby made its producer while standing by; the promotion only fences with it.
        prepared = standby.gate.kafka.producer
        assert prepared is not None
        summary = standby.gate.promote()
        assert summary["epoch"] == 2
        assert standby.gate.kafka.producer is prepared
        # The broker refuses the old primary's transaction: the promotion's initTransactions
        # bumped the producer epoch of the stage's transactional id.
        old = primary.gate.kafka.producer
        with pytest.raises(KafkaException) as refused:
            old.begin_transaction()
            old.produce(sink, key="zombie", value=b"{}")
            old.commit_transaction(10)
        assert "fenced" in refused.value.args[0].str().lower()
        # And Backstop's own epoch refuses it before it gets that far.
        with pytest.raises(FencedError):
            primary.gate.kafka.write("results", [HashRow("9" * 26, "zombie", "1")])
        generators.generate_to_kafka(
            bootstrap, source, "wordcount", count=300, rate=1e6, seed=6, id_prefix="h"
        )
        standby.process_all_available()
    finally:
        standby.stop()
    entries, _ = valid_input(bootstrap, source, ["text"])
    expected = truth.wordcount(entries)
    got, duplicates = output_audit(bootstrap, sink)
    assert got == expected
    assert duplicates == 0
    assert {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()} == expected


def test_offsets_lost_to_retention_fail_the_stage_unless_loss_is_accepted(
    spark, redis_conn, redis_url, job, tmp_path, topics
):
    bootstrap, source, _sink = topics
    (stage,) = compile_stages(get_topology("wordcount"), FUSED, job=job)
    generators.generate_to_kafka(bootstrap, source, "wordcount", count=300, rate=1e6, seed=7)
    save_io(redis_conn, job, bootstrap, source, None)
    # The plan log's starting point is taken now (earliest: offset 0 of every partition)...
    rt = runtime(spark, redis_conn, redis_url, job, stage, PRIMARY, tmp_path)
    rt.process_all_available()
    rt.stop()
    generators.generate_to_kafka(
        bootstrap, source, "wordcount", count=300, rate=1e6, seed=8, id_prefix="x"
    )
    # ...then retention deletes the first 50 new offsets of partition 0 before they are read.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = {TopicPartition(source, p): OffsetSpec.latest() for p in range(3)}
    ends = {tp.partition: f.result().offset for tp, f in admin.list_offsets(request).items()}
    read = int(json.loads(redis_conn.lindex(keys.kafka_plans(job), -1))["end"]["0"])
    cut_at = read + 50
    assert ends[0] > cut_at
    for future in admin.delete_records([TopicPartition(source, 0, cut_at)]).values():
        future.result(30)
    rt = runtime(spark, redis_conn, redis_url, job, stage, PRIMARY, tmp_path)
    with pytest.raises(Exception, match="50 offsets of .* partition 0 .* deleted by retention"):
        rt.process_all_available()
    rt.stop()
    save_io(redis_conn, job, bootstrap, source, None, accept_loss=True)
    rt = runtime(spark, redis_conn, redis_url, job, stage, PRIMARY, tmp_path)
    try:
        rt.process_all_available()
    finally:
        rt.stop()
    assert redis_conn.hget(keys.stats(job), "kafka:skipped") == "50"


def test_spark_refuses_real_time_mode_on_the_kafka_source(spark, redis_url, job, tmp_path, topics):
    """What the launch's refusal of `trigger: realtime` rests on (console/services/jobs.py):
    Spark's real-time mode does not take a Python data source, so Backstop's Kafka source
    cannot run in it."""
    bootstrap, source, _sink = topics
    generators.generate_to_kafka(bootstrap, source, "wordcount", count=10, rate=1e6, seed=9)
    df = (
        spark.readStream.format("backstop_kafka")
        .option("bootstrapServers", bootstrap)
        .option("topic", source)
        .option("fields", "text")
        .option("redisUrl", redis_url)
        .option("job", job)
        .option("stage", "rtm")
        .load()
    )
    query = (
        df.writeStream.format("console")
        .outputMode("update")
        .option("checkpointLocation", str(tmp_path / "rtm"))
        .trigger(realTime="5 seconds")
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException, match="INPUT_STREAM_NOT_SUPPORTED"):
            query.awaitTermination(60)
    finally:
        query.stop()


def test_a_spare_warms_a_kafka_jobs_plan_on_its_newest_records(
    spark, redis_conn, redis_url, job, topics
):
    """A warm spare runs a Kafka job's stage plan through the Kafka source on the topic's newest
    records (WARM_INPUT_ENTRIES shared among the partitions), under a plan log of its own; it
    writes nothing to the job's sink and leaves no key behind."""
    from spark_runtime.spare_plans import WARM_INPUT_ENTRIES, stage_plans, warm_up_plan

    bootstrap, source, sink = topics
    generators.generate_to_kafka(bootstrap, source, "wordcount", count=90, rate=1e6, seed=11)
    save_io(redis_conn, job, bootstrap, source, sink)
    topology = get_topology("wordcount")
    (plan,) = stage_plans("wordcount", {"all": [op.name for op in topology.operators]})
    per_partition = Counter(p for p, *_rest in committed(bootstrap, source))
    expected = sum(min(n, WARM_INPUT_ENTRIES // 3) for n in per_partition.values())
    before = sorted(redis_conn.scan_iter(match=f"{keys.job_prefix(job)}*"))
    rows = warm_up_plan(
        spark, redis_conn, redis_url, {**plan, "job": job}, f"{job}-warm", threading.Event()
    )
    assert rows == expected
    assert committed(bootstrap, sink) == []
    assert sorted(redis_conn.scan_iter(match=f"{keys.job_prefix(job)}*")) == before
    assert not list(redis_conn.scan_iter(match=f"{keys.job_prefix(job + '-warm')}*"))
