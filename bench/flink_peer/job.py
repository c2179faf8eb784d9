"""The benchmark's wordcount and topn workloads as a PyFlink DataStream job (the Flink peer).

Submitted by `flink run --python bench/flink_peer/job.py --topology ... --job ... --input-dir ...`
to the standalone cluster of bench/flink_peer/cluster.py (`FlinkCluster.submit`). With
`--source files` (`manage.py bench --source redis`) it reads the lines the bridge
(bench/flink_peer/bridge.py) copies from the job's Redis input stream, with Flink's FileSource in
continuous mode (replayable, so checkpoints are exactly-once on the input side), computes the
same results as Backstop's jobs and upserts them into the same results hash
(`spark_runtime.keys.results`): word -> count, or window start -> JSON top-N. The upserts are
absolute values, so a replay after a restore writes the same values again and the final results
can be compared with the same ground truth (console/policy/truth.py).

Every subtask that writes results also publishes progress records (spark_runtime.progress) about
every `FLUSH_S`: the input events its writes covered and the event-time latency percentiles of
its writes, so the console's recovery measurement reads Flink's output exactly as it reads a
Backstop job's.

With `--source kafka` (`manage.py bench --source kafka`) it reads the run's input topic with
Flink's KafkaSource (the values are the same JSON objects: id, ts, payload) and writes each
result as a record of its output topic with Flink's KafkaSink, exactly once
(DeliveryGuarantee.EXACTLY_ONCE: one Kafka transaction per checkpoint, committed when the
checkpoint completes, under a transactional id prefix of the run's own). The records are
Backstop's (`{"key", "value", "version"}`, functions.result_record), the version a counter kept in
the operator's keyed state. The connector is Flink's jar (`--connector-jar`, connector.py),
given to the job as a pipeline jar. Progress records then come from the harness, which reads
the output topic as a read_committed consumer does (kafka_io.OutputWatcher).

A task failure is injected through Redis: a writing subtask that finds the job's fault flag
(`keys.flink_task_fault`, taken with GETDEL, so exactly one subtask takes it) raises.

Runs in Flink's Python workers (the Flink environment, bench/flink_peer/env.py): no Django, no
PySpark; only `bench.flink_peer.functions` and, through it, `spark_runtime.keys`,
`spark_runtime.progress` and `spark_runtime.redis_client`, which import neither.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pyflink.common import Duration, SimpleStringSchema, Types, WatermarkStrategy
from pyflink.datastream import CheckpointingMode, StreamExecutionEnvironment
from pyflink.datastream.connectors.base import DeliveryGuarantee
from pyflink.datastream.connectors.file_system import FileSource, StreamFormat
from pyflink.datastream.connectors.kafka import (
    KafkaOffsetsInitializer,
    KafkaRecordSerializationSchema,
    KafkaSink,
    KafkaSource,
)
from pyflink.datastream.functions import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from bench.flink_peer.functions import (
    FLUSH_S,
    ResultWriter,
    TopicResultWriter,
    kafka_sink_properties,
    kafka_source_properties,
    split_line,
    window_item,
)

SOURCES = ("files", "kafka")

# How often the FileSource looks for the bridge's new files, unless --discovery-ms says
# (`manage.py bench --flink-discovery-ms`; FlinkSettings.discovery_ms in cluster.py).
DISCOVERY_MS = 100


class FlushingFunction(KeyedProcessFunction):
    """A keyed function that writes results: a processing-time timer flushes its progress
    record when no further element comes (the end of the input, or a pause)."""

    operator = ""

    def __init__(self, redis_url: str, job: str, to_topic: bool = False):
        self.redis_url = redis_url
        self.job = job
        # Results as records for the KafkaSink (emitted) instead of upserts into Redis.
        self.to_topic = to_topic
        self.writer: ResultWriter | TopicResultWriter | None = None

    def open_writer(self, runtime_context: RuntimeContext) -> None:
        writer = TopicResultWriter if self.to_topic else ResultWriter
        self.writer = writer(
            self.redis_url, self.job, self.operator, runtime_context.get_index_of_this_subtask()
        )

    def write(self, key: str, value: str, ts: int, events: int, version: int):
        """Upsert one result; on a topic, the record to emit (none on Redis)."""
        record = self.writer.upsert(key, value, ts, events, version)
        return iter(()) if record is None else iter((record,))

    def schedule_flush(self, ctx: KeyedProcessFunction.Context) -> None:
        # One timer per key and 100 ms slot: registering the same time again is a no-op.
        slot = (ctx.timer_service().current_processing_time() // 100 + 3) * 100
        ctx.timer_service().register_processing_time_timer(slot)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        if time.time() - self.writer.flushed_at >= FLUSH_S:
            self.writer.flush(time.time())
        return iter(())


class CountWords(FlushingFunction):
    """word -> running count (keyed state); upserts the count. Each element is (word, event ts,
    1 if it is the first word of its line): the first words count the input lines."""

    operator = "count"

    def open(self, runtime_context: RuntimeContext):
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))
        self.open_writer(runtime_context)

    def process_element(self, value, ctx):
        word, ts, first = value
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        self.schedule_flush(ctx)
        # The count grows by one per element: it is the result's version too.
        return self.write(word, str(count), ts, first, count)


class CountItems(KeyedProcessFunction):
    """(window, item) -> running count; emits (window, item, count, event ts).

    The state of past windows is kept for the run (a benchmark job of minutes: some 50 items a
    window). Dropping it on a processing-time timer, as a first version did, lost counts: a
    restore replays the input since the checkpoint, and a timer that fired during the replay
    cleared windows the replay was still counting. A long-running job would drop them on
    event-time timers behind a watermark instead."""

    def open(self, runtime_context: RuntimeContext):
        self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value, ctx):
        window, item, ts = value
        count = (self.count.value() or 0) + 1
        self.count.update(count)
        yield window, item, count, ts


class TopN(FlushingFunction):
    """window -> the top `n` items by count (counts only grow: the maximum seen per item);
    upserts the window's top-N as JSON [[item, count], ...], Backstop's results format."""

    operator = "topn"

    def __init__(self, redis_url: str, job: str, n: int, to_topic: bool = False):
        super().__init__(redis_url, job, to_topic)
        self.n = n

    def open(self, runtime_context: RuntimeContext):
        self.counts = runtime_context.get_map_state(
            MapStateDescriptor("counts", Types.STRING(), Types.LONG())
        )
        # On a topic: how many results of the window were written (the last one's version).
        if self.to_topic:
            self.versions = runtime_context.get_state(ValueStateDescriptor("version", Types.LONG()))
        self.open_writer(runtime_context)

    def process_element(self, value, ctx):
        window, item, count, ts = value
        if count > (self.counts.get(item) or 0):
            self.counts.put(item, count)
        top = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[: self.n]
        version = 0
        if self.to_topic:
            version = (self.versions.value() or 0) + 1
            self.versions.update(version)
        self.schedule_flush(ctx)
        return self.write(str(window), json.dumps([[i, c] for i, c in top]), ts, 1, version)


def kafka_source(args: argparse.Namespace) -> KafkaSource:
    """The run's input topic from its earliest offsets (replayable: the offsets read are in
    each checkpoint), values as strings (the JSON objects of the generator)."""
    builder = (
        KafkaSource.builder()
        .set_bootstrap_servers(args.bootstrap)
        .set_topics(args.input_topic)
        .set_group_id(args.transactional_id_prefix)
        .set_starting_offsets(KafkaOffsetsInitializer.earliest())
        .set_value_only_deserializer(SimpleStringSchema())
    )
    for key, value in kafka_source_properties().items():
        builder = builder.set_property(key, value)
    return builder.build()


def kafka_sink(args: argparse.Namespace) -> KafkaSink:
    """The run's output topic, exactly once: the records of a checkpoint's interval in one
    transaction, committed when the checkpoint completes."""
    serializer = (
        KafkaRecordSerializationSchema.builder()
        .set_topic(args.output_topic)
        .set_value_serialization_schema(SimpleStringSchema())
        .build()
    )
    builder = (
        KafkaSink.builder()
        .set_bootstrap_servers(args.bootstrap)
        .set_record_serializer(serializer)
        .set_delivery_guarantee(DeliveryGuarantee.EXACTLY_ONCE)
        .set_transactional_id_prefix(args.transactional_id_prefix)
    )
    for key, value in kafka_sink_properties().items():
        builder = builder.set_property(key, value)
    return builder.build()


def build(env: StreamExecutionEnvironment, args: argparse.Namespace) -> None:
    """The job graph: bridge files or the input topic -> parse -> keyed counts -> result
    writer (Redis), or -> the output topic."""
    to_topic = args.source == "kafka"
    if to_topic:
        lines = env.from_source(kafka_source(args), WatermarkStrategy.no_watermarks(), "kafka")
    else:
        source = (
            FileSource.for_record_stream_format(StreamFormat.text_line_format(), args.input_dir)
            .monitor_continuously(Duration.of_millis(args.discovery_ms))
            .build()
        )
        lines = env.from_source(source, WatermarkStrategy.no_watermarks(), "redis-bridge")
    # On a topic the writing operator emits its records (strings) to the KafkaSink.
    emitted = {"output_type": Types.STRING()} if to_topic else {}
    if args.topology == "wordcount":
        words = lines.flat_map(
            split_line, output_type=Types.TUPLE([Types.STRING(), Types.LONG(), Types.INT()])
        ).name("split")
        results = (
            words.key_by(lambda w: w[0], key_type=Types.STRING())
            .process(CountWords(args.redis_url, args.job, to_topic), **emitted)
            .name("count")
        )
    elif args.topology == "topn":
        window_ms = args.window_seconds * 1000
        pairs = lines.map(
            lambda line: window_item(line, window_ms),
            output_type=Types.TUPLE([Types.LONG(), Types.STRING(), Types.LONG()]),
        ).name("parse")
        counts = (
            pairs.key_by(lambda p: f"{p[0]}|{p[1]}", key_type=Types.STRING())
            .process(
                CountItems(),
                output_type=Types.TUPLE([Types.LONG(), Types.STRING(), Types.LONG(), Types.LONG()]),
            )
            .name("window_count")
        )
        results = (
            counts.key_by(lambda c: c[0], key_type=Types.LONG())
            .process(TopN(args.redis_url, args.job, args.n, to_topic), **emitted)
            .name("topn")
        )
    else:
        raise SystemExit(f"--topology: wordcount or topn, not {args.topology!r}")
    if to_topic:
        results.sink_to(kafka_sink(args)).name("kafka-results")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", required=True)
    parser.add_argument("--job", required=True, help="the job key of the Redis input and results")
    parser.add_argument("--source", choices=SOURCES, default="files")
    parser.add_argument("--input-dir", help="the bridge's directory (--source files)")
    parser.add_argument("--redis-url", required=True, help="results (files), the fault flag")
    parser.add_argument("--bootstrap", help="the Kafka cluster (--source kafka)")
    parser.add_argument("--input-topic", help="--source kafka")
    parser.add_argument("--output-topic", help="--source kafka")
    parser.add_argument(
        "--transactional-id-prefix", help="the run's own (--source kafka); also the group id"
    )
    parser.add_argument("--connector-jar", help="Flink's Kafka connector (--source kafka)")
    parser.add_argument("--checkpoint-ms", type=int, required=True)
    parser.add_argument("--discovery-ms", type=int, default=DISCOVERY_MS)
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--window-seconds", type=int, default=10)
    parser.add_argument("--n", type=int, default=5)
    args = parser.parse_args(argv)
    needed = (
        ("bootstrap", "input_topic", "output_topic", "transactional_id_prefix", "connector_jar")
        if args.source == "kafka"
        else ("input_dir",)
    )
    missing = [name for name in needed if not getattr(args, name)]
    if missing:
        options = ", ".join("--" + name.replace("_", "-") for name in missing)
        parser.error(f"--source {args.source} needs {options}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    env = StreamExecutionEnvironment.get_execution_environment()
    if args.source == "kafka":
        env.add_jars(Path(args.connector_jar).resolve().as_uri())
    env.set_parallelism(args.parallelism)
    env.enable_checkpointing(args.checkpoint_ms, CheckpointingMode.EXACTLY_ONCE)
    build(env, args)
    env.execute(f"backstop-peer-{args.topology}-{args.job}")


if __name__ == "__main__":
    main()
