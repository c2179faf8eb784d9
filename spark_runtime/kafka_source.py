"""A Spark 4 Python streaming data source over a Kafka topic, read through confluent-kafka.

Why not Spark's own Kafka connector: it must match the installed PySpark exactly, and
`spark-sql-kafka-0-10_2.13` 4.3.0 is not on Maven Central (docs/KAFKA.md says more). This
source keeps each partition's offsets in Spark's checkpoint like the connector does, and adds
what Backstop's replicas need: one order over all partitions that every replica shares (the plan
log, spark_runtime/kafka_plan.py), so a hot standby reading the topic on its own produces the
same record positions as its primary, and a seeded standby resumes from the primary's plan.

Rows have the columns of the Redis source (spark_runtime/redis_source.py): `pos`, `entry`
(`partition:offset`), `id` (the value's `id` field, else `partition-offset`), `ts` (the record's
timestamp or the declared event-time field) and the declared payload fields, decoded from the
record's value as a JSON object. A record that does not decode goes to the job's dead-letter
stream and counter (as on Redis) and to the topic's dead-letter topic, once per stage.

Faults: a broker that does not answer is waited for (no new batch is planned; a batch being read
waits for it in the Python worker, however long it is away), with the cause in the job's stats
hash (`kafka:source`) until it answers again: the driver writes it when it cannot plan, a worker
when it cannot read, and each deletes it once the broker answers it (the driver also deletes a
cause a worker left behind, every few seconds). A missing topic is reported the same way.
Offsets deleted by retention before they were read fail the batch with their count, unless the
source accepts loss: then they are skipped and counted (`kafka:skipped`).
"""

from __future__ import annotations

import json
import logging
import time
from bisect import bisect_right

from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from spark_runtime import keys
from spark_runtime.external_io import EVENT_TIME_FROM_RECORD
from spark_runtime.kafka_plan import (
    Plan,
    Segment,
    cut,
    next_plan_ms,
    offset_end,
    offset_plan_index,
    plan_segments,
    plan_size,
    position,
    task_groups,
)
from spark_runtime.kafka_read import (
    CLIENT_LOG,
    RECONNECT_BACKOFF_MAX_MS,
    committed_reader,
    low_watermark,
    read_range,
)
from spark_runtime.redis_client import connect
from spark_runtime.redis_source import DEAD_LUA, parse_fields, payload, schema_for

log = logging.getLogger(__name__)

FORMAT_NAME = "backstop_kafka"
# Plans read ahead per call when a replica is behind the log's tip.
LOOKAHEAD = 64
# How long one question to the broker may take before this trigger gives up (the next asks again).
BROKER_TIMEOUT_S = 5.0
# How often a replica publishes its lag (keys.kafka_lag), seconds.
LAG_EVERY_S = 1.0
# While the broker answers, the driver deletes a source cause this often even if it wrote none:
# a worker that waited for the broker and died before it could delete its own.
CLEAR_EVERY_S = 5.0
# Stats fields (keys.stats): the current cause of a stalled source, offsets skipped as lost.
SOURCE_CAUSE = "kafka:source"
SKIPPED = "kafka:skipped"

# Appends a plan only if the log has the length the caller planned from (compare-and-set), and
# returns the log's length after the call: a replica that lost the race reads the winner's plan.
APPEND_PLAN_LUA = """
if redis.call('LLEN', KEYS[1]) == tonumber(ARGV[1]) then
  redis.call('RPUSH', KEYS[1], ARGV[2])
end
return redis.call('LLEN', KEYS[1])
"""

# Counts skipped offsets once per (stage, plan, partition) however often a batch is replayed.
SKIP_LUA = """
if redis.call('HSETNX', KEYS[1], ARGV[1], '1') == 1 then
  redis.call('HINCRBY', KEYS[2], ARGV[2], tonumber(ARGV[3]))
  return 1
end
return 0
"""


class OffsetsLost(RuntimeError):
    """Offsets the job had not read were deleted by the topic's retention."""


def decode(value: bytes | None, fields: list[tuple[str, str]], event_time: str):
    """`(raw object, payload values, event time or None, None)` for a value that decodes, or
    `(None, None, None, reason)`."""
    if value is None:
        return None, None, None, "empty value"
    try:
        obj = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, None, None, f"value is not JSON: {exc.msg if hasattr(exc, 'msg') else exc}"
    if not isinstance(obj, dict):
        return None, None, None, f"value is not a JSON object: {type(obj).__name__}"
    values, reason = payload(obj, fields)
    if values is None:
        return None, None, None, reason
    ts = None
    if event_time != EVENT_TIME_FROM_RECORD:
        raw_ts = obj.get(event_time)
        if isinstance(raw_ts, bool) or not isinstance(raw_ts, int):
            return None, None, None, f"event time {event_time} is not an integer: {raw_ts!r}"
        ts = raw_ts
    return obj, values, ts, None


class PlanRange(InputPartition):
    """What one read task of a micro-batch reads: segments of plans (kafka_plan.task_groups),
    each the offsets [first, end) of one partition inside one plan."""

    def __init__(self, segments: list[Segment]):
        super().__init__(tuple(segments))
        self.segments = segments


# Clients of this Python process, by address: Spark reuses its Python workers between tasks.
_worker_clients: dict[tuple[str, str], object] = {}


def _worker_client(kind: str, address: str):
    client = _worker_clients.get((kind, address))
    if client is None:
        if kind == "redis":
            client = connect(address)
        elif kind == "producer":
            client = Producer({"bootstrap.servers": address, "linger.ms": 5, "logger": CLIENT_LOG})
        else:
            client = committed_reader(address, "backstop-reader")
        _worker_clients[(kind, address)] = client
    return client


class KafkaPlanReader(DataSourceStreamReader):
    """Plans batches on the driver side (the shared plan log) and reads ranges in the workers."""

    def __init__(self, options: dict, fields: list[tuple[str, str]]):
        opts = {str(k).lower(): v for k, v in options.items()}
        self.bootstrap = opts["bootstrapservers"]
        self.topic = opts["topic"]
        self.redis_url = opts.get("redisurl", "redis://127.0.0.1:6379/0")
        self.job = opts.get("job", "")
        self.stage = opts.get("stage", "")
        self.starting = opts.get("startingoffsets", "earliest")
        self.event_time = opts.get("eventtime", EVENT_TIME_FROM_RECORD)
        self.max_records = int(opts.get("maxrecordspertrigger", "5000"))
        self.accept_loss = opts.get("acceptloss", "false").lower() == "true"
        self.dead_topic = opts.get("deadlettertopic", f"{self.topic}.dead")
        self.pace_key = opts.get("pacekey")
        # Set for a stage replica: its per-partition lag goes to keys.kafka_lag under this id.
        self.replica = opts.get("replica")
        self._lag_at = 0.0  # time.monotonic() of the last lag published
        self.fields = fields
        self._read_new_at = 0.0
        self._redis = None
        self._admin = None
        self._cause = None  # the cause last written to the stats hash
        self._cleared_at = 0.0  # time.monotonic() when the driver last deleted a cause

    def __getstate__(self):
        # Clients are per process and not picklable: the workers open their own.
        state = dict(self.__dict__)
        state["_redis"] = state["_admin"] = None
        return state

    # -- driver side ---------------------------------------------------------------------------

    def _client(self):
        if self._redis is None:
            self._redis = connect(self.redis_url)
        return self._redis

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(
                {
                    "bootstrap.servers": self.bootstrap,
                    "socket.timeout.ms": 5_000,
                    "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
                    "logger": CLIENT_LOG,
                }
            )
        return self._admin

    def _report(self, cause: str | None) -> None:
        """Keep the source's current cause in the job's stats hash (cleared once it answers;
        every CLEAR_EVERY_S as well, for a cause a worker left)."""
        if cause is None:
            now = time.monotonic()
            if self._cause is None and now - self._cleared_at < CLEAR_EVERY_S:
                return
            self._cleared_at = now
            self._client().hdel(keys.stats(self.job), SOURCE_CAUSE)
            if self._cause is not None:
                log.info("kafka source %s: the broker answers again", self.topic)
        elif cause != self._cause:
            self._client().hset(keys.stats(self.job), SOURCE_CAUSE, cause)
            log.warning("kafka source %s: %s", self.topic, cause)
        self._cause = cause

    def _partitions(self) -> list[int] | None:
        """The topic's partitions, or None (with the cause reported) when they cannot be had."""
        try:
            meta = self._admin_client().list_topics(self.topic, timeout=BROKER_TIMEOUT_S)
        except KafkaException as exc:
            self._report(f"broker {self.bootstrap} does not answer: {exc.args[0].str()}")
            return None
        topic = meta.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            self._report(f"topic {self.topic} does not exist on {self.bootstrap}")
            return None
        return sorted(topic.partitions)

    def _offsets(self, spec) -> dict[int, int] | None:
        """Each partition's offset by `spec` (committed records only), or None with the cause."""
        partitions = self._partitions()
        if partitions is None:
            return None
        request = {TopicPartition(self.topic, p): spec for p in partitions}
        try:
            futures = self._admin_client().list_offsets(
                request,
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=BROKER_TIMEOUT_S,
            )
            found = {tp.partition: f.result().offset for tp, f in futures.items()}
        except KafkaException as exc:
            self._report(f"broker {self.bootstrap} does not answer: {exc.args[0].str()}")
            return None
        self._report(None)
        return found

    def _publish_lag(self, read: dict[int, int], end: dict[int, int] | None) -> None:
        """Record how far this replica's reading is behind the topic's end, per partition
        (at most every LAG_EVERY_S; `end` None: look it up now)."""
        now = time.monotonic()
        if self.replica is None or now - self._lag_at < LAG_EVERY_S:
            return
        if end is None:
            end = self._offsets(OffsetSpec.latest())
            if end is None:
                return
        self._lag_at = now
        entry = {
            "stage": self.stage,
            "topic": self.topic,
            "at": time.time(),
            "partitions": {str(p): [read.get(p, 0), o] for p, o in sorted(end.items())},
        }
        self._client().hset(keys.kafka_lag(self.job), self.replica, json.dumps(entry))

    def _append(self, expected_length: int, plan: Plan) -> None:
        self._client().eval(
            APPEND_PLAN_LUA, 1, keys.kafka_plans(self.job), expected_length, plan.to_json()
        )

    def _plans(self, first: int, last: int) -> list[Plan]:
        raws = self._client().lrange(keys.kafka_plans(self.job), first, last)
        return [Plan.from_json(first + i, raw) for i, raw in enumerate(raws)]

    def initialOffset(self) -> dict:
        delay = 0.5
        while True:
            found = self._plans(0, 0)
            if found:
                return found[0].offset()
            spec = OffsetSpec.earliest() if self.starting == "earliest" else OffsetSpec.latest()
            start = self._offsets(spec)
            if start is not None:
                self._append(0, Plan(0, int(time.time() * 1000), start))
                continue
            # No broker yet: a query waits for it rather than fail (it is retried for ever).
            time.sleep(delay)
            delay = min(delay * 2, 10.0)

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_records)

    def _pace_s(self) -> float | None:
        if self.pace_key is None:
            return None
        pace = self._client().get(self.pace_key)
        return None if pace is None else float(pace)

    def latestOffset(self, start: dict, limit) -> dict:
        pace = self._pace_s()
        if pace is not None and time.monotonic() - self._read_new_at < pace:
            return start  # no new batch on this trigger (a paced standby)
        budget = 0 if isinstance(limit, ReadAllAvailable) else int(limit.max_rows)
        index = offset_plan_index(start)
        for _ in range(3):  # a lost race is followed by reading the winner's plan
            ahead = self._plans(index + 1, index + LOOKAHEAD)
            if ahead:
                self._publish_lag(offset_end(start), None)
                chosen = ahead[0]
                taken = plan_size(offset_end(start), chosen.end)
                for plan in ahead[1:]:
                    size = plan_size(chosen.end, plan.end)
                    if budget and taken + size > budget:
                        break
                    chosen, taken = plan, taken + size
                at_tip = chosen.index == ahead[-1].index and len(ahead) < LOOKAHEAD
                self._read_new_at = time.monotonic() if at_tip else 0.0
                return chosen.offset()
            available = self._offsets(OffsetSpec.latest())
            if available is None:
                return start
            self._publish_lag(offset_end(start), available)
            end = cut(offset_end(start), available, budget)
            if plan_size(offset_end(start), end) == 0:
                self._read_new_at = time.monotonic()
                return start
            previous = self._plans(index, index)
            previous_ms = previous[0].ms if previous else 0
            plan = Plan(index + 1, next_plan_ms(previous_ms, int(time.time() * 1000)), end)
            self._append(index + 1, plan)
        return start

    def partitions(self, start: dict, end: dict):
        first, last = offset_plan_index(start), offset_plan_index(end)
        if last <= first:
            return []
        segments = plan_segments(offset_end(start), self._plans(first + 1, last))
        return [PlanRange(group) for group in task_groups(segments)]

    def commit(self, end: dict) -> None:
        # The topic's retention, not Backstop, decides when records go.
        return None

    # -- worker side ---------------------------------------------------------------------------

    def read(self, part: PlanRange):
        consumer = _worker_client("consumer", self.bootstrap)
        waiting = WorkerWait(self)
        by_partition: dict[int, list[Segment]] = {}
        for segment in part.segments:
            by_partition.setdefault(segment.partition, []).append(segment)
        for partition, segments in by_partition.items():
            # The partition's segments are contiguous: one pass over [first, end), each record
            # placed in the plan segment holding its offset.
            span = segments[0]._replace(end=segments[-1].end)
            starts = [s.first for s in segments]
            first = self._check_lost(consumer, span, waiting)
            dead: list[tuple[int, bytes | None, str]] = []
            for msg in read_range(
                consumer, self.topic, partition, first, span.end, on_wait=waiting.waiting
            ):
                waiting.answered()
                segment = segments[bisect_right(starts, msg.offset()) - 1]
                row, reason = self._row(segment, msg)
                if row is None:
                    dead.append((msg.offset(), msg.value(), reason))
                else:
                    yield row
            waiting.answered()
            if dead:
                self._dead_letter(partition, dead)

    def _row(self, part: Segment, msg):
        obj, values, ts, reason = decode(msg.value(), self.fields, self.event_time)
        if obj is None:
            return None, reason
        offset = msg.offset()
        if ts is None:
            ts = msg.timestamp()[1]
        rid = obj.get("id")
        if not isinstance(rid, str) or not rid:
            rid = f"{part.partition}-{offset}"
        pos = position(part.plan_ms, part.base + offset - part.first)
        return (pos, f"{part.partition}:{offset}", rid, int(ts), *values), None

    def _check_lost(self, consumer, part: Segment, waiting: WorkerWait) -> int:
        """Where to start reading `part`: its first offset, or the earliest one kept when
        retention deleted offsets before them (counted when loss is accepted, else raised)."""
        low = low_watermark(consumer, self.topic, part.partition, BROKER_TIMEOUT_S, waiting.waiting)
        waiting.answered()
        if low <= part.first:
            return part.first
        lost = min(low, part.end) - part.first
        if not self.accept_loss:
            raise OffsetsLost(
                f"{lost} offsets of {self.topic} partition {part.partition} "
                f"({part.first}..{part.first + lost - 1}) were deleted by retention before "
                f"stage {self.stage} read them"
            )
        client = _worker_client("redis", self.redis_url)
        client.eval(
            SKIP_LUA, 2, keys.dead_seen(self.job), keys.stats(self.job),
            f"skip|{self.stage}|{part.plan}|{part.partition}", SKIPPED, lost,
        )  # fmt: skip
        return min(low, part.end)

    def _dead_letter(self, partition: int, dead: list) -> None:
        """Dead-letter each record once per stage: the Redis stream and counter the job page
        shows, and the topic's dead-letter topic."""
        client = _worker_client("redis", self.redis_url)
        script = client.register_script(DEAD_LUA)
        dead_keys = [keys.dead_letters(self.job), keys.dead_seen(self.job), keys.stats(self.job)]
        producer = _worker_client("producer", self.bootstrap)
        for offset, value, reason in dead:
            entry = f"{partition}:{offset}"
            raw = (value or b"")[:2000].decode("utf-8", "replace")
            seen = f"{self.stage}|{self.topic}|{entry}"
            if script(keys=dead_keys, args=[seen, entry, self.stage, reason, raw]):
                letter = {"topic": self.topic, "partition": partition, "offset": offset,
                          "stage": self.stage, "reason": reason, "raw": raw}  # fmt: skip
                producer.produce(self.dead_topic, key=entry, value=json.dumps(letter))
        producer.flush(30)


class WorkerWait:
    """A Python worker's part of the source's cause: written to the job's stats hash when a read
    has waited BROKER_TIMEOUT_S for the broker (at once on a "broker away" error) and again every
    BROKER_TIMEOUT_S while it waits (another replica's driver may have deleted it), deleted when
    the broker answers this worker again."""

    def __init__(self, reader: KafkaPlanReader):
        self.reader = reader
        self.reported = False
        self.reported_at = 0.0  # time.monotonic() of the last write

    def waiting(self, quiet_s: float, error) -> None:
        now = time.monotonic()
        if error is None and quiet_s < BROKER_TIMEOUT_S:
            return
        if self.reported and now - self.reported_at < BROKER_TIMEOUT_S:
            return
        why = error.str() if error is not None else f"nothing read for {quiet_s:.0f} s"
        cause = f"broker {self.reader.bootstrap} does not answer: {why}"
        client = _worker_client("redis", self.reader.redis_url)
        client.hset(keys.stats(self.reader.job), SOURCE_CAUSE, cause)
        if not self.reported:
            log.warning("kafka source %s (worker): %s", self.reader.topic, cause)
        self.reported, self.reported_at = True, now

    def answered(self) -> None:
        if not self.reported:
            return
        client = _worker_client("redis", self.reader.redis_url)
        client.hdel(keys.stats(self.reader.job), SOURCE_CAUSE)
        log.info("kafka source %s (worker): the broker answers again", self.reader.topic)
        self.reported = False


class KafkaPlanDataSource(DataSource):
    """`spark.readStream.format("backstop_kafka")` with options `bootstrapServers`, `topic`,
    `fields`, `redisUrl`, `job`, `stage`, `startingOffsets`, `eventTime`,
    `maxRecordsPerTrigger`, `acceptLoss`, `deadLetterTopic`, `paceKey`, `replica`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return schema_for(parse_fields(self.options.get("fields", "")))

    def streamReader(self, schema) -> KafkaPlanReader:
        return KafkaPlanReader(self.options, parse_fields(self.options.get("fields", "")))
