"""Spark's `format("kafka")` for an existing app, where Spark's own Kafka connector is missing.

An app written for Spark's Kafka connector (`spark.readStream.format("kafka")`,
`df.writeStream.format("kafka")`, `df.write.format("kafka")` in a foreachBatch) needs
`spark-sql-kafka-0-10` at exactly the installed PySpark's version, and 4.3.0 is not on Maven
Central (docs/KAFKA.md). Spark refuses a Python data source registered under the name `kafka`
(it fails the lookup with KAFKA_DATA_SOURCE_NOT_ENABLED before it looks at Python data
sources), so `install_kafka_format` maps the name instead, in an app's stage process: a stream
reader's and a batch writer's `format("kafka")` becomes `format(FORMAT_NAME)`, this module's
data source, and a stream writer's becomes a foreachBatch function (StreamingKafkaSink: a
Python data source sink takes append mode only, and an aggregation writes updates). The app
runs unmodified. Where the connector is on the classpath nothing is mapped.

The source reads what Spark's does: rows of SPARK_KAFKA_SCHEMA, options `kafka.bootstrap.servers`,
`subscribe`, `startingOffsets` (`earliest`, `latest` or Spark's JSON), `maxOffsetsPerTrigger`,
`failOnDataLoss` and `kafka.*` client settings, and offsets in the checkpoint in Spark's form
(topic -> partition -> next offset). The options it cannot honour are refused by name
(UNSUPPORTED_OPTIONS), never ignored.

The sink takes Spark's columns (`value`, optional `key`, `topic`, `partition`) and writes each
micro-batch in one Kafka transaction together with the batch id (a mark in MARKS_TOPIC), under a
`transactional.id` made from the query's id, which its checkpoint keeps: a restarted app fences its
predecessor at the broker and skips a batch it finds already marked, so a batch run again after
a crash writes nothing twice (Spark's own sink is at least once). The batch's rows pass through
the driver to be written in one transaction. A batch write (`df.write.format("kafka")`) is at
least once, as Spark's is.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from dataclasses import dataclass

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.readwriter import DataFrameWriter
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.streaming.readwriter import DataStreamReader, DataStreamWriter

from spark_runtime.kafka_admin import create_missing
from spark_runtime.kafka_plan import cut
from spark_runtime.kafka_read import (
    CLIENT_LOG,
    committed_reader,
    low_watermark,
    read_range,
    read_topic,
)
from spark_runtime.kafka_sink import retrying
from spark_runtime.sink import FencedError

log = logging.getLogger(__name__)

FORMAT_NAME = "backstop_spark_kafka"
# The rows of Spark's Kafka source (without headers).
SPARK_KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
# Spark's timestampType: 0 the producer's create time, 1 the broker's log-append time.
TIMESTAMP_TYPES = {TIMESTAMP_CREATE_TIME: 0, TIMESTAMP_LOG_APPEND_TIME: 1}
# Where the sink keeps each query's last written batch id (compacted, one partition).
MARKS_TOPIC = "backstop-app-sink.marks"
# How long one question to the broker may take before a trigger plans no batch (the next asks).
BROKER_TIMEOUT_S = 5.0
COMMIT_TIMEOUT_S = 30.0
CLIENT_PREFIX = "kafka."
BOOTSTRAP = "kafka.bootstrap.servers"
# Spark options this source and sink cannot honour, with what to do instead.
UNSUPPORTED_OPTIONS = {
    "subscribepattern": "list the topics in subscribe",
    "assign": "list the topics in subscribe",
    "includeheaders": "headers are not read",
    "startingtimestamp": "use startingOffsets",
    "startingoffsetsbytimestamp": "use startingOffsets",
    "kafka.group.id": "the source assigns partitions and joins no group",
}


class KafkaOptionError(ValueError):
    """An option of the app's Kafka reader or writer that cannot be honoured."""


def _lower(options) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _refuse_unsupported(opts: dict[str, str]) -> None:
    for name, instead in UNSUPPORTED_OPTIONS.items():
        if name in opts and not (name == "includeheaders" and opts[name].lower() == "false"):
            raise KafkaOptionError(f"Kafka option {name} is not supported here: {instead}")


def client_settings(opts: dict[str, str]) -> dict[str, str]:
    """The `kafka.*` options other than the bootstrap servers, as client settings."""
    return {
        k[len(CLIENT_PREFIX) :]: v
        for k, v in opts.items()
        if k.startswith(CLIENT_PREFIX) and k != BOOTSTRAP
    }


def _bootstrap(opts: dict[str, str]) -> str:
    if not opts.get(BOOTSTRAP):
        raise KafkaOptionError(f"Kafka option {BOOTSTRAP} must be set")
    return opts[BOOTSTRAP]


@dataclass(frozen=True)
class ReaderOptions:
    """What a `readStream.format("kafka")` asked for, checked."""

    bootstrap: str
    topics: tuple[str, ...]
    starting: str | dict  # "earliest", "latest" or {topic: {partition: offset, -2 earliest}}
    max_offsets: int  # per trigger, 0: no bound
    fail_on_data_loss: bool
    client: dict[str, str]

    @classmethod
    def parse(cls, options) -> ReaderOptions:
        """The reader's options, or KafkaOptionError naming the one that is wrong."""
        opts = _lower(options)
        _refuse_unsupported(opts)
        bootstrap = _bootstrap(opts)
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        if not topics:
            raise KafkaOptionError("Kafka option subscribe must name at least one topic")
        starting_text = opts.get("startingoffsets", "latest").strip()
        if starting_text.lower() in ("earliest", "latest"):
            starting = starting_text.lower()
        else:
            try:
                starting = json.loads(starting_text)
            except ValueError:
                starting = None
            if not isinstance(starting, dict) or not all(
                isinstance(parts, dict) and all(isinstance(o, int) for o in parts.values())
                for parts in starting.values()
            ):
                raise KafkaOptionError(
                    "Kafka option startingOffsets must be earliest, latest or JSON such as "
                    f'{{"topic": {{"0": 23, "1": -2}}}}: {starting_text[:100]!r}'
                )
        max_text = opts.get("maxoffsetspertrigger", "0")
        if not max_text.isdigit():
            raise KafkaOptionError(f"Kafka option maxOffsetsPerTrigger must be a count: {max_text}")
        loss = opts.get("failondataloss", "true").lower()
        if loss not in ("true", "false"):
            raise KafkaOptionError(f"Kafka option failOnDataLoss must be true or false: {loss}")
        return cls(
            bootstrap, topics, starting, int(max_text), loss == "true", client_settings(opts)
        )

    def read_committed(self) -> bool:
        """Whether the app reads committed records only (Spark's default reads all)."""
        return self.client.get("isolation.level", "read_uncommitted") == "read_committed"


def _admin(bootstrap: str, client: dict[str, str]) -> AdminClient:
    settings = {**client, "bootstrap.servers": bootstrap, "logger": CLIENT_LOG}
    settings.pop("isolation.level", None)  # a consumer setting
    return AdminClient(settings)


Offsets = dict[str, dict[str, int]]  # topic -> partition (as text, JSON's keys) -> offset


class SparkKafkaStreamReader(DataSourceStreamReader):
    """Plans micro-batches from each partition's offsets on the driver; reads them in tasks."""

    def __init__(self, options: ReaderOptions):
        self.options = options
        self._admin_client = None
        self._latest: Offsets | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_admin_client"] = None  # per process, not picklable
        return state

    def _listed(self, spec) -> Offsets | None:
        """Each partition's offset by `spec`, or None (logged) while the broker does not answer
        or a topic does not exist."""
        if self._admin_client is None:
            self._admin_client = _admin(self.options.bootstrap, self.options.client)
        admin = self._admin_client
        try:
            meta = admin.list_topics(timeout=BROKER_TIMEOUT_S)
            request = {}
            for topic in self.options.topics:
                found = meta.topics.get(topic)
                if found is None or found.error is not None or not found.partitions:
                    log.warning("kafka source: topic %s does not exist on %s", topic,
                                self.options.bootstrap)  # fmt: skip
                    return None
                request.update({TopicPartition(topic, p): spec for p in found.partitions})
            level = (
                IsolationLevel.READ_COMMITTED
                if self.options.read_committed()
                else IsolationLevel.READ_UNCOMMITTED
            )
            futures = admin.list_offsets(
                request, isolation_level=level, request_timeout=BROKER_TIMEOUT_S
            )
            listed: Offsets = {}
            for tp, future in futures.items():
                listed.setdefault(tp.topic, {})[str(tp.partition)] = future.result().offset
            return listed
        except KafkaException as exc:
            log.warning("kafka source: broker %s does not answer: %s", self.options.bootstrap,
                        exc.args[0].str())  # fmt: skip
            return None

    def initialOffset(self) -> Offsets:
        delay = 0.5
        while True:  # a query waits for a broker that is not there yet, rather than fail
            earliest = self._listed(OffsetSpec.earliest())
            latest = self._listed(OffsetSpec.latest()) if earliest is not None else None
            if latest is not None:
                return starting_offsets(self.options.starting, earliest, latest)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)

    def getDefaultReadLimit(self):
        if self.options.max_offsets:
            return ReadMaxRows(self.options.max_offsets)
        return ReadAllAvailable()

    def latestOffset(self, start: Offsets, limit) -> Offsets:
        latest = self._listed(OffsetSpec.latest())
        if latest is None:
            return start  # no batch while the broker is away; the next trigger asks again
        self._latest = latest
        budget = 0 if isinstance(limit, ReadAllAvailable) else int(limit.max_rows)
        return next_end(start, latest, budget)

    def reportLatestOffset(self) -> Offsets | None:
        return self._latest

    def partitions(self, start: Offsets, end: Offsets):
        return [
            InputPartition((topic, int(p), first, last))
            for topic, p, first, last in offset_ranges(start, end)
        ]

    def read(self, partition: InputPartition):
        topic, number, first, end = partition.value
        consumer = _consumer(self.options)
        first = self._first_kept(consumer, topic, number, first, end)
        for msg in read_range(consumer, topic, number, first, end):
            ts_type, ts = msg.timestamp()
            yield (
                msg.key(),
                msg.value(),
                topic,
                number,
                msg.offset(),
                datetime.datetime.fromtimestamp(ts / 1000, tz=datetime.UTC) if ts >= 0 else None,
                TIMESTAMP_TYPES.get(ts_type, -1),
            )

    def _first_kept(self, consumer, topic: str, number: int, first: int, end: int) -> int:
        """`first`, or the earliest offset kept when retention deleted the ones before it
        (an error unless failOnDataLoss is false, as in Spark). A broker that is away is asked
        again until it answers, as the read that follows waits for it."""
        low = low_watermark(consumer, topic, number, BROKER_TIMEOUT_S, self._broker_away)
        if low <= first:
            return first
        lost = min(low, end) - first
        message = (
            f"{lost} offsets of {topic} partition {number} ({first}..{first + lost - 1}) were "
            "deleted by retention before the query read them"
        )
        if self.options.fail_on_data_loss:
            raise RuntimeError(message + " (set failOnDataLoss to false to skip them)")
        log.warning("kafka source: %s; skipped (failOnDataLoss false)", message)
        return min(low, end)

    def _broker_away(self, _waited_s: float, error: KafkaError) -> None:
        log.warning("kafka source: broker %s does not answer: %s", self.options.bootstrap,
                    error.str())  # fmt: skip

    def commit(self, end: Offsets) -> None:
        return None  # Spark's source commits nothing to Kafka either


def starting_offsets(starting, earliest: Offsets, latest: Offsets) -> Offsets:
    """The first batch's start: every partition's earliest or latest offset, or the app's JSON
    (-2 earliest, -1 latest; a partition it does not name starts at its earliest)."""
    if starting == "earliest":
        return earliest
    if starting == "latest":
        return latest
    start: Offsets = {}
    for topic, parts in earliest.items():
        asked = starting.get(topic, {})
        start[topic] = {}
        for p, low in parts.items():
            wanted = asked.get(p, -2)
            start[topic][p] = low if wanted == -2 else latest[topic][p] if wanted == -1 else wanted
    return start


def next_end(start: Offsets, latest: Offsets, budget: int) -> Offsets:
    """The next batch's end: what every partition has, at most `budget` offsets in all (0: no
    bound), shared fairly; a partition new since `start` starts at 0."""
    have = {(t, int(p)): o for t, parts in start.items() for p, o in parts.items()}
    available = {(t, int(p)): o for t, parts in latest.items() for p, o in parts.items()}
    from_start = {key: have.get(key, 0) for key in available}
    end = cut(from_start, {k: max(o, from_start[k]) for k, o in available.items()}, budget)
    out: Offsets = {}
    for (topic, p), offset in sorted(end.items()):
        out.setdefault(topic, {})[str(p)] = offset
    return out


def offset_ranges(start: Offsets, end: Offsets) -> list[tuple[str, int, int, int]]:
    """(topic, partition, first, end) of every partition with offsets in [start, end)."""
    ranges = []
    for topic, parts in sorted(end.items()):
        for p, last in sorted(parts.items(), key=lambda item: int(item[0])):
            first = start.get(topic, {}).get(p, 0)
            if last > first:
                ranges.append((topic, int(p), first, last))
    return ranges


# Consumers and producers of this Python process: Spark reuses its Python workers.
_consumers: dict[tuple, object] = {}
_producers: dict[tuple, Producer] = {}


def _consumer(options: ReaderOptions):
    key = (options.bootstrap, tuple(sorted(options.client.items())))
    consumer = _consumers.get(key)
    if consumer is None:
        # Spark's source reads uncommitted records unless the app says otherwise.
        settings = {"isolation.level": "read_uncommitted", **options.client}
        consumer = committed_reader(options.bootstrap, "backstop-app-reader", settings)
        _consumers[key] = consumer
    return consumer


@dataclass(frozen=True)
class WriterOptions:
    """What a `writeStream.format("kafka")` or `write.format("kafka")` asked for, checked."""

    bootstrap: str
    topic: str | None  # the `topic` option; a `topic` column overrides it per row
    client: dict[str, str]
    query: str  # the streaming query's id (kept in its checkpoint), "" for a batch write

    @classmethod
    def parse(cls, options, columns: list[str], query: str = "") -> WriterOptions:
        """The writer's options, or KafkaOptionError naming what is wrong."""
        opts = _lower(options)
        _refuse_unsupported(opts)
        if "value" not in columns:
            raise KafkaOptionError("the Kafka sink needs a value column (string or binary)")
        if "headers" in columns:
            raise KafkaOptionError("the Kafka sink here does not write headers: drop the column")
        topic = opts.get("topic")
        if not topic and "topic" not in columns:
            raise KafkaOptionError("Kafka option topic must be set, or the rows have a topic")
        return cls(_bootstrap(opts), topic, client_settings(opts), query)

    def transactional_id(self) -> str:
        """The id every run of this query produces under: a query restarted from its
        checkpoint keeps its id, so its new writer fences the old one."""
        return f"backstop.app.{self.query}"


SINK_COLUMNS = ("topic", "partition", "key", "value")


def _rows(options: WriterOptions, rows) -> list[tuple]:
    """(topic, partition or None, key, value) of each row, in bytes."""
    out = []
    for row in rows:
        fields = row.asDict()
        topic = fields.get("topic") or options.topic
        if not topic:
            raise KafkaOptionError("a row has no topic and the Kafka option topic is not set")
        out.append((topic, fields.get("partition"), _bytes(fields.get("key")),
                    _bytes(fields.get("value"))))  # fmt: skip
    return out


def _bytes(value) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    return str(value).encode()


def _produce(producer: Producer, rows: list[tuple], on_delivery=None) -> None:
    for topic, partition, key, value in rows:
        extra = {} if partition is None else {"partition": int(partition)}
        if on_delivery is not None:
            extra["on_delivery"] = on_delivery
        while True:
            try:
                producer.produce(topic, key=key, value=value, **extra)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)


class StreamingKafkaSink:
    """The foreachBatch function a mapped `writeStream.format("kafka")` becomes: Python data
    source sinks take append mode only, and an app's aggregation writes updates. Each batch
    goes out in one transaction with its id (TransactionalBatches)."""

    def __init__(self, options: dict[str, str]):
        self.options = dict(options)
        self.query_id: str | None = None  # set once the query has started
        self.started = threading.Event()

    def __call__(self, batch, batch_id: int) -> None:
        # The first batch may come before start() has returned the query.
        if not self.started.wait(COMMIT_TIMEOUT_S):
            raise RuntimeError("the Kafka sink's query did not report its id")
        options = WriterOptions.parse(self.options, batch.columns, self.query_id)
        columns = [c for c in SINK_COLUMNS if c in batch.columns]
        rows = _rows(options, batch.select(*columns).collect())
        TransactionalBatches.of(options).write(batch_id, rows)

    def query_started(self, query) -> None:
        self.query_id = str(query.id)
        self.started.set()


class TransactionalBatches:
    """One query's transactional producer in this process and the last batch id it wrote."""

    _open: dict[str, TransactionalBatches] = {}

    def __init__(self, options: WriterOptions):
        self.options = options
        self.txid = options.transactional_id()
        self.producer = Producer(
            {
                **options.client,
                "bootstrap.servers": options.bootstrap,
                "logger": CLIENT_LOG,
                "transactional.id": self.txid,
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        create_missing(
            options.bootstrap, [NewTopic(MARKS_TOPIC, 1, config={"cleanup.policy": "compact"})]
        )
        # Fences every earlier producer of this query (a killed app's) at the broker.
        retrying(lambda: self.producer.init_transactions(COMMIT_TIMEOUT_S), self.txid)
        self.written = self._marked_batch()

    @classmethod
    def of(cls, options: WriterOptions) -> TransactionalBatches:
        """The writer of `options`' query in this process, made (and fencing) on first use."""
        found = cls._open.get(options.transactional_id())
        if found is None:
            found = cls._open[options.transactional_id()] = cls(options)
        return found

    def _marked_batch(self) -> int:
        consumer = committed_reader(self.options.bootstrap, "backstop-app-marks")
        try:
            marks = [m for m in read_topic(consumer, MARKS_TOPIC) if m.key() == self.txid.encode()]
        finally:
            consumer.close()
        return json.loads(marks[-1].value())["batch"] if marks else -1

    def write(self, batch_id: int, rows: list[tuple]) -> None:
        """Produce the batch's rows and its mark in one transaction, unless already written."""
        if batch_id <= self.written:
            log.info("kafka sink: batch %s of %s was written before; skipped", batch_id, self.txid)
            return
        while True:
            self.producer.begin_transaction()
            try:
                _produce(self.producer, rows)
                mark = json.dumps({"batch": batch_id, "query": self.options.query})
                self.producer.produce(MARKS_TOPIC, key=self.txid, value=mark)
                retrying(lambda: self.producer.commit_transaction(COMMIT_TIMEOUT_S), self.txid)
                break
            except FencedError:
                TransactionalBatches._open.pop(self.txid, None)  # a newer run writes now
                raise
            except KafkaException as exc:
                if not exc.args[0].txn_requires_abort():
                    TransactionalBatches._open.pop(self.txid, None)
                    raise
                log.warning("kafka sink: transaction aborted (%s); writing it again",
                            exc.args[0].str())  # fmt: skip
                retrying(lambda: self.producer.abort_transaction(COMMIT_TIMEOUT_S), self.txid)
        self.written = batch_id


class SparkKafkaBatchWriter(DataSourceWriter):
    """`df.write.format("kafka")`: each task produces its rows and waits for them (at least
    once, as Spark's sink)."""

    def __init__(self, options: WriterOptions):
        self.options = options

    def write(self, iterator) -> WriterCommitMessage:
        key = (self.options.bootstrap, tuple(sorted(self.options.client.items())))
        producer = _producers.get(key)
        if producer is None:
            settings = {**self.options.client, "bootstrap.servers": self.options.bootstrap}
            producer = _producers[key] = Producer(
                {**settings, "logger": CLIENT_LOG, "linger.ms": 5}
            )
        failed: list[KafkaError] = []

        def delivered(error, _message) -> None:
            if error is not None:
                failed.append(error)

        _produce(producer, _rows(self.options, iterator), delivered)
        # A broker that is away is waited for; a record it never took fails the task.
        while producer.flush(COMMIT_TIMEOUT_S):
            log.warning("kafka sink: waiting for %s to take a batch's records",
                        self.options.bootstrap)  # fmt: skip
        if failed:
            raise KafkaException(failed[0])
        return WriterCommitMessage()


class SparkKafkaCompatSource(DataSource):
    """The data source behind a mapped `format("kafka")` (module doc)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SPARK_KAFKA_SCHEMA

    def streamReader(self, schema) -> SparkKafkaStreamReader:
        return SparkKafkaStreamReader(ReaderOptions.parse(self.options))

    def writer(self, schema, overwrite: bool) -> SparkKafkaBatchWriter:
        if overwrite:
            raise KafkaOptionError("the Kafka sink cannot overwrite a topic: use mode append")
        return SparkKafkaBatchWriter(WriterOptions.parse(self.options, schema.fieldNames()))


def spark_kafka_connector_present(spark) -> bool:
    """Whether Spark's own Kafka connector is on the session's classpath (asked of Spark's
    data source lookup, which has no Python API)."""
    lookup = spark._jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource
    try:
        lookup("kafka", spark._jsparkSession.sessionState().conf())
    except (AnalysisException, Py4JJavaError):  # PySpark converts the Java error it knows
        return False
    return True


def install_kafka_format(spark) -> bool:
    """Make `format("kafka")` of this process's stream readers and batch writers mean
    FORMAT_NAME, and a stream writer's a StreamingKafkaSink, unless Spark's own connector is
    there; returns whether it did."""
    if spark_kafka_connector_present(spark):
        return False
    spark.dataSource.register(SparkKafkaCompatSource)
    if not getattr(DataStreamReader.format, "_backstop_kafka", False):
        DataStreamReader.format = _mapped_format(DataStreamReader.format)
    if not getattr(DataFrameWriter.format, "_backstop_kafka", False):
        DataFrameWriter.format = _mapped_format(DataFrameWriter.format, append=True)
    if not getattr(DataStreamWriter.start, "_backstop_kafka", False):
        _wrap_stream_writer()
    log.info('format("kafka") is Backstop\'s Kafka source and sink (no Spark connector)')
    return True


def _is_kafka(source) -> bool:
    return str(source).lower() == "kafka"


def _mapped_format(original, append: bool = False):
    """`original` with `format("kafka")` meaning FORMAT_NAME; `append` for a batch writer:
    Spark's Kafka sink takes the default save mode (error if exists), a Python data source only
    append or overwrite, and a batch write to Kafka appends, as Spark's does."""

    def format_(self, source):
        if not _is_kafka(source):
            return original(self, source)
        mapped = original(self, FORMAT_NAME)
        return mapped.mode("append") if append else mapped

    format_._backstop_kafka = True
    return format_


def _option_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _wrap_stream_writer() -> None:
    """A stream writer told `format("kafka")` keeps its options in Python; its `start` makes
    them a StreamingKafkaSink and starts the query with it as the foreachBatch function."""
    format_, option, options = (
        DataStreamWriter.format,
        DataStreamWriter.option,
        DataStreamWriter.options,
    )
    start = DataStreamWriter.start

    def sink_options(writer) -> dict[str, str] | None:
        return getattr(writer, "_backstop_kafka_options", None)

    def format_kafka(self, source):
        if not _is_kafka(source):
            return format_(self, source)
        self._backstop_kafka_options = {}
        return self

    def option_kafka(self, key, value):
        if sink_options(self) is not None:
            sink_options(self)[str(key).lower()] = _option_text(value)
        return option(self, key, value)

    def options_kafka(self, **kwargs):
        if sink_options(self) is not None:
            sink_options(self).update({k.lower(): _option_text(v) for k, v in kwargs.items()})
        return options(self, **kwargs)

    def start_kafka(self, *args, **kwargs):
        if _is_kafka(kwargs.get("format")):
            format_kafka(self, kwargs.pop("format"))
        if sink_options(self) is None:
            return start(self, *args, **kwargs)
        reserved = ("path", "format", "outputMode", "partitionBy", "queryName")
        sink_options(self).update(
            {k.lower(): _option_text(v) for k, v in kwargs.items() if k not in reserved}
        )
        sink = StreamingKafkaSink(sink_options(self))
        self.foreachBatch(sink)
        query = start(self, *args, **kwargs)
        sink.query_started(query)
        return query

    for name, wrapper in (("format", format_kafka), ("option", option_kafka),
                          ("options", options_kafka), ("start", start_kafka)):  # fmt: skip
        wrapper._backstop_kafka = True
        setattr(DataStreamWriter, name, wrapper)
