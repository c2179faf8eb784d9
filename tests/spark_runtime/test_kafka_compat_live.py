"""An unmodified app written for Spark's Kafka connector, run on a real broker and a real
SparkSession through `install_kafka_format` (spark_runtime/kafka_compat.py): its word counts
on the output topic are exact across a restart from the checkpoint and across a broker
outage, a restarted writer fences its predecessor at the broker, a batch already written is
not written again, and a foreachBatch app's batch writes arrive."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic

from spark_runtime.app_stage import AppRun, install_checkpoint_defaults
from spark_runtime.apps import AppDefinition
from spark_runtime.kafka_admin import create_missing
from spark_runtime.kafka_compat import (
    TransactionalBatches,
    WriterOptions,
    install_kafka_format,
)
from spark_runtime.sink import FencedError
from tests.conftest import wait_until
from tests.kafka_topics import committed, counts_written, produce_lines

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

WORDCOUNT_APP = """\
import sys
from pyspark.sql import SparkSession, functions as F

bootstrap, source, out = sys.argv[1:4]
spark = SparkSession.builder.getOrCreate()
lines = (
    spark.readStream.format("kafka")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", source)
    .option("startingOffsets", "earliest")
    .option("maxOffsetsPerTrigger", 40)
    .load()
)
words = lines.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
counts = words.groupBy("word").count()
(
    counts.select(F.col("word").alias("key"), F.col("count").cast("string").alias("value"))
    .writeStream.format("kafka")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("topic", out)
    .outputMode("update")
    .queryName("counts")
    .trigger(processingTime="300 milliseconds")
    .start()
)
spark.streams.awaitAnyTermination()
"""

FOREACH_BATCH_APP = """\
import sys
from pyspark.sql import SparkSession, functions as F

bootstrap, source, out = sys.argv[1:4]
spark = SparkSession.builder.getOrCreate()
lines = (
    spark.readStream.format("kafka")
    .option("kafka.bootstrap.servers", bootstrap)
    .option("subscribe", source)
    .option("startingOffsets", "earliest")
    .load()
)


def upper(batch, batch_id):
    (
        batch.select(F.upper(F.col("value").cast("string")).alias("value"))
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out)
        .save()
    )


lines.writeStream.foreachBatch(upper).start()
spark.streams.awaitAnyTermination()
"""


@pytest.fixture(scope="module")
def spark():
    from spark_runtime.config import build_session

    session = build_session("backstop-tests-kafka-compat")
    assert install_kafka_format(session), "Spark's own Kafka connector is on the classpath here"
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def own_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def topics(bootstrap: str, prefix: str, partitions: int = 3) -> tuple[str, str]:
    source, out = f"{prefix}-in", f"{prefix}-out"
    create_missing(bootstrap, [NewTopic(source, partitions, 1), NewTopic(out, 1, 1)])
    return source, out


def run_app(spark, source: str, args: list[str]) -> AppRun:
    run = AppRun(spark, AppDefinition("t", "apps/t.py", source), args)
    run.start()
    return run


def test_an_unmodified_kafka_app_counts_exactly_once_across_a_restart(
    spark, kafka_broker, tmp_path
):
    bootstrap = kafka_broker.bootstrap_servers
    source, out = topics(bootstrap, "compat-wc")
    first = [f"w{i % 7} w{i % 3} shared" for i in range(150)]
    produce_lines(bootstrap, source, first)
    install_checkpoint_defaults(str(tmp_path / "replica"))
    run = run_app(spark, WORDCOUNT_APP, [bootstrap, source, out])
    expected = Counter(w for line in first for w in line.split())
    wait_until(lambda: counts_written(bootstrap, out)[0] == expected, 120, "the first counts")
    # Several batches (maxOffsetsPerTrigger 40 of 150 records), each in its own transaction.
    assert len(spark.streams.active) == 1
    run.stop()

    # The same app again, from the checkpoint the first run left (query-counts: a restart
    # after a kill, as a new stage process starts it).
    second = [f"w{i % 5} late" for i in range(60)]
    produce_lines(bootstrap, source, second)
    run = run_app(spark, WORDCOUNT_APP, [bootstrap, source, out])
    expected += Counter(w for line in second for w in line.split())
    wait_until(lambda: counts_written(bootstrap, out)[0] == expected, 120, "the counts after")
    run.stop()
    _latest, written = counts_written(bootstrap, out)
    assert len(written) == len(set(written)), "a (word, count) update was written twice"
    assert max(c for w, c in written if w == "shared") == 150
    assert run.error is None


def test_the_app_goes_on_exactly_across_a_broker_outage(spark, kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    source, out = topics(bootstrap, "compat-outage")
    first = [f"o{i % 5} base" for i in range(50)]
    produce_lines(bootstrap, source, first)
    install_checkpoint_defaults(str(tmp_path / "replica"))
    run = run_app(spark, WORDCOUNT_APP, [bootstrap, source, out])
    expected = Counter(w for line in first for w in line.split())
    wait_until(lambda: counts_written(bootstrap, out)[0] == expected, 120, "the first counts")
    # Lines keep coming while the broker is killed for 5 s (the producer holds them meanwhile).
    during = [f"o{i % 3} during" for i in range(150)]
    feeder = threading.Thread(target=lambda: produce_lines(bootstrap, source, during, every_s=0.1))
    feeder.start()
    time.sleep(3)
    kafka_broker.stop_for(5)
    feeder.join(120)
    expected += Counter(w for line in during for w in line.split())
    wait_until(lambda: counts_written(bootstrap, out)[0] == expected, 180, "the counts after")
    run.stop()
    assert run.error is None
    _latest, written = counts_written(bootstrap, out)
    assert len(written) == len(set(written)), "a (word, count) update was written twice"


def test_a_restarted_writer_fences_the_old_one_and_skips_a_written_batch(kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    _source, out = topics(bootstrap, "compat-fence")
    options = WriterOptions(bootstrap, out, {}, str(tmp_path / "query-1"))
    old = TransactionalBatches(options)
    old.write(0, [(out, None, b"a", b"1")])
    # The app restarts in another process: its writer of the same query fences the old one.
    new = TransactionalBatches(options)
    assert new.written == 0, "the new writer reads the batch the old one committed"
    with pytest.raises((KafkaException, FencedError)):
        old.write(1, [(out, None, b"zombie", b"1")])
    new.write(0, [(out, None, b"a", b"1")])  # batch 0 run again: already written
    new.write(1, [(out, None, b"b", b"1")])
    assert [(k, v) for _p, _o, k, v in committed(bootstrap, out)] == [(b"a", b"1"), (b"b", b"1")]


def test_a_foreach_batch_app_writes_its_batches_to_kafka(spark, kafka_broker, tmp_path):
    bootstrap = kafka_broker.bootstrap_servers
    source, out = topics(bootstrap, "compat-fb")
    lines = [json.dumps({"n": i}) for i in range(30)]
    produce_lines(bootstrap, source, lines)
    install_checkpoint_defaults(str(tmp_path / "replica"))
    run = run_app(spark, FOREACH_BATCH_APP, [bootstrap, source, out])
    want = sorted(line.upper() for line in lines)
    wait_until(
        lambda: sorted(v.decode() for _p, _o, _k, v in committed(bootstrap, out)) == want,
        120,
        "the foreachBatch app's writes",
    )
    run.stop()
    assert run.error is None
