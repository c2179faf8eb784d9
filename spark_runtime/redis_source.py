"""A Spark 4 Python streaming data source over a Redis stream.

Offsets are Redis stream entry ids (`{"id": "1700000000000-3"}`: everything up to and including
that id has been read). A restarted query replays from the offset in its checkpoint, because
Redis keeps the entries (the data plane never trims an input stream). `latestOffset(start, limit)`
honours Spark's admission control (`ReadMaxRows` from the `maxRecordsPerBatch` option), and
`partitions` splits large ranges into parallel partitions of `partitionSize` entries each.

Each entry must carry `id` (unique string), `ts` (event time, epoch ms, integer) and the payload
fields named in the `fields` option. Malformed entries are not returned: they are written to the
job's dead-letter stream with the reason, once per (stage, entry) even when a batch is replayed.

Rows have the columns `pos` (the entry id as one sortable long: ms * 1e6 + seq), `entry`
(the Redis entry id), `id`, `ts` and the payload fields.
"""

from __future__ import annotations

import time

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from spark_runtime import keys
from spark_runtime.redis_client import connect

FORMAT_NAME = "redis_stream"
SEQ_FACTOR = 1_000_000  # pos = ms * SEQ_FACTOR + seq; seq stays far below 1e6 in practice
SPARK_TYPES = {"string": "string", "int": "bigint", "double": "double"}

# Walks the stream from an exclusive start id to an inclusive end id, at most `max` entries
# (0: no limit), and returns every `psize`-th id plus the last one: the batch end offset and the
# partition boundaries in one round trip, without shipping the entries to the client.
PLAN_LUA = """
local cur = ARGV[1]
local last = ARGV[2]
local maxn = tonumber(ARGV[3])
local psize = tonumber(ARGV[4])
local bounds = {}
local n = 0
while true do
  local want = psize
  if maxn > 0 and n + want > maxn then want = maxn - n end
  if want <= 0 then break end
  local r = redis.call('XRANGE', KEYS[1], '(' .. cur, last, 'COUNT', want)
  if #r == 0 then break end
  n = n + #r
  cur = r[#r][1]
  table.insert(bounds, cur)
  if #r < want then break end
end
return bounds
"""

# Counts the entries after an exclusive start id, up to ARGV[2] of them, and returns that count
# and the age in ms of the oldest (the server's clock against its entry id's milliseconds): what
# a held batch of light input (RedisStreamReader.hold_light_input) decides on, in one round trip.
PENDING_LUA = """
local r = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', tonumber(ARGV[2]))
if #r == 0 then return {0, 0} end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first_ms = tonumber(string.match(r[1][1], '^(%d+)'))
return {#r, now_ms - first_ms}
"""

# Light input: fewer entries than this waiting. A held batch runs at once when this many wait:
# by then the batch's cost grows with its rows rather than being its fixed part (about 0.2-0.3 s
# of CPU a batch, docs/RESULTS.md "Batch cost"), and holding it would only add latency.
LIGHT_INPUT_RECORDS = 500

# Dead-letters an entry once per stage: HSETNX on the seen-hash gates the XADD and the counter.
DEAD_LUA = """
if redis.call('HSETNX', KEYS[2], ARGV[1], '1') == 1 then
  redis.call('XADD', KEYS[1], '*', 'entry', ARGV[2], 'stage', ARGV[3], 'reason', ARGV[4],
             'raw', ARGV[5])
  redis.call('HINCRBY', KEYS[3], 'dead:' .. ARGV[3], 1)
  return 1
end
return 0
"""


def parse_fields(spec: str) -> list[tuple[str, str]]:
    """Parse a field spec such as `"text"` or `"sensor,lane:int,value:double"`."""
    fields = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, kind = part.partition(":")
        kind = kind or "string"
        if kind not in SPARK_TYPES:
            raise ValueError(f"field {name!r}: unknown type {kind!r}")
        fields.append((name, kind))
    return fields


def schema_for(fields: list[tuple[str, str]]) -> str:
    """The DDL schema of the rows for the given payload fields."""
    cols = ["pos bigint", "entry string", "id string", "ts bigint"]
    cols += [f"{name} {SPARK_TYPES[kind]}" for name, kind in fields]
    return ", ".join(cols)


def entry_pos(entry_id: str) -> int:
    """A Redis entry id `ms-seq` as one sortable integer."""
    ms, _, seq = entry_id.partition("-")
    return int(ms) * SEQ_FACTOR + int(seq)


def _convert(value, kind: str):
    if kind == "int":
        if isinstance(value, (bool, float)):
            raise ValueError(value)
        return int(value)
    if kind == "double":
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def payload(raw: dict, fields: list[tuple[str, str]]):
    """Return `(values, None)` with the declared fields of `raw` converted, or `(None, reason)`.
    Shared by every source: a Redis entry's strings and a JSON object's values alike."""
    values = []
    for name, kind in fields:
        value = raw.get(name)
        if value is None:
            return None, f"missing field {name}"
        try:
            values.append(_convert(value, kind))
        except (TypeError, ValueError):
            return None, f"field {name} is not {kind}: {str(value)[:40]!r}"
    return values, None


def validate(entry_id: str, raw: dict, fields: list[tuple[str, str]]):
    """Return `(row, None)` for a well-formed entry or `(None, reason)` for a malformed one."""
    rid = raw.get("id")
    if not rid:
        return None, "missing id"
    ts = raw.get("ts")
    if ts is None:
        return None, "missing ts"
    try:
        ts_value = int(ts)
    except ValueError:
        return None, f"ts is not an integer: {ts[:40]!r}"
    values, reason = payload(raw, fields)
    if values is None:
        return None, reason
    return (entry_pos(entry_id), entry_id, rid, ts_value, *values), None


# Clients of this Python process by URL. Spark reuses its Python workers between tasks
# (spark.python.worker.reuse), and a client per read meant a new connection every micro-batch.
_worker_clients: dict[str, object] = {}


def worker_client(url: str):
    """This process's client for `url`, created on first use."""
    client = _worker_clients.get(url)
    if client is None:
        client = _worker_clients[url] = connect(url)
    return client


class RangePartition(InputPartition):
    """Entries with ids in (start, end]."""

    def __init__(self, start: str, end: str):
        super().__init__((start, end))
        self.start = start
        self.end = end


class RedisStreamReader(DataSourceStreamReader):
    """The stream reader; lives in Spark's driver-side Python runner (offsets, planning) and is
    pickled to the executors' Python workers (read)."""

    def __init__(self, options: dict, fields: list[tuple[str, str]]):
        # Spark hands options over case-insensitively; look them up in lower case.
        opts = {str(k).lower(): v for k, v in options.items()}
        self.redis_url = opts.get("redisurl", "redis://127.0.0.1:6379/0")
        self.stream = opts["stream"]
        self.job = opts.get("job", "")
        self.stage = opts.get("stage", "")
        self.start_id = opts.get("startid", "0-0")
        self.max_records = int(opts.get("maxrecordsperbatch", "5000"))
        self.partition_size = int(opts.get("partitionsize", "2000"))
        # Set for a stage replica: while this key holds a number of seconds, a new batch reads
        # new input only that long after the previous one did (a paced standby, keys.batch_pace).
        self.pace_key = opts.get("pacekey")
        self._read_new_at = 0.0  # time.monotonic() of the last offset that moved forward
        # Light input is held this many seconds at most before a batch reads it (0: never held;
        # the policy's light_input_wait_s, docs/POLICY.md "Idle replicas").
        self.light_wait_s = float(opts.get("lightinputwaits", "0") or 0)
        self._batched_at = time.monotonic()  # the last offset that moved forward, held or not
        self._paced = False  # whether the previous call found a pace
        self.fields = fields
        self._client = None

    def _redis(self):
        # Created lazily: the reader is pickled to executors and a client is not picklable.
        if self._client is None:
            self._client = connect(self.redis_url)
        return self._client

    def _plan(self, start: str, end: str, max_count: int) -> list[str]:
        client = self._redis()
        return client.eval(PLAN_LUA, 1, self.stream, start, end, max_count, self.partition_size)

    def initialOffset(self) -> dict:
        return {"id": self.start_id}

    def getDefaultReadLimit(self):
        return ReadMaxRows(self.max_records)

    def _pace_s(self) -> float | None:
        """The replica's batch pace in seconds, None while it is not paced."""
        if self.pace_key is None:
            return None
        pace = self._redis().get(self.pace_key)
        return None if pace is None else float(pace)

    def hold_light_input(self, start: dict) -> bool:
        """Whether to run no batch on this trigger: fewer than LIGHT_INPUT_RECORDS entries wait,
        the oldest of them arrived less than `light_wait_s` ago, and the last batch read less
        than `light_wait_s` ago (the bound when entry ids are not the server's clock). Nothing
        waiting holds too: Spark would run no batch anyway. A replica with light input then
        pays a batch's fixed cost every `light_wait_s` instead of on every trigger."""
        if self.light_wait_s <= 0:
            return False
        if time.monotonic() - self._batched_at >= self.light_wait_s:
            return False
        count, age_ms = self._redis().eval(
            PENDING_LUA, 1, self.stream, start["id"], LIGHT_INPUT_RECORDS
        )
        return count == 0 or (count < LIGHT_INPUT_RECORDS and age_ms < 1000 * self.light_wait_s)

    def latestOffset(self, start: dict, limit) -> dict:
        pace = self._pace_s()
        # Returning `start` means no new input: Spark runs no batch on this trigger.
        if pace is not None and time.monotonic() - self._read_new_at < pace:
            return start
        # A pace just lifted (a promotion, or a standby fallen behind) reads at once: the
        # input it left is what the new primary owes its output.
        paced_before, self._paced = self._paced, pace is not None
        if pace is None and not paced_before and self.hold_light_input(start):
            return start
        max_count = 0 if isinstance(limit, ReadAllAvailable) else int(limit.max_rows)
        bounds = self._plan(start["id"], "+", max_count)
        if not bounds:
            return start
        end = bounds[-1]
        self._batched_at = time.monotonic()
        if pace is not None:
            # A read cut short by the limit left input behind: the pace waits only after a read
            # that reached the newest entry, so a paced replica is never held further behind.
            newest = self._redis().xrevrange(self.stream, count=1)
            self._read_new_at = time.monotonic() if newest and newest[0][0] == end else 0.0
        return {"id": end}

    def partitions(self, start: dict, end: dict):
        if start["id"] == end["id"]:
            return []
        bounds = self._plan(start["id"], end["id"], 0)
        parts = []
        lower = start["id"]
        for upper in bounds:
            parts.append(RangePartition(lower, upper))
            lower = upper
        return parts

    def read(self, partition: RangePartition):
        client = worker_client(self.redis_url)
        dead = client.register_script(DEAD_LUA)
        dead_keys = [keys.dead_letters(self.job), keys.dead_seen(self.job), keys.stats(self.job)]
        cursor = partition.start
        while True:
            entries = client.xrange(self.stream, f"({cursor}", partition.end, count=1000)
            if not entries:
                return
            for entry_id, raw in entries:
                row, reason = validate(entry_id, raw, self.fields)
                if row is not None:
                    yield row
                else:
                    seen = f"{self.stage}|{self.stream}|{entry_id}"
                    dead(keys=dead_keys, args=[seen, entry_id, self.stage, reason, str(raw)])
            cursor = entries[-1][0]
            if cursor == partition.end:
                return

    def commit(self, end: dict) -> None:
        # Nothing to release: input streams are kept so any checkpointed offset can be replayed.
        return None


class RedisStreamDataSource(DataSource):
    """`spark.readStream.format("redis_stream")` with options `stream`, `fields`, `redisUrl`,
    `job`, `stage`, `startId`, `maxRecordsPerBatch`, `partitionSize`, `paceKey`,
    `lightInputWaitS`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return schema_for(parse_fields(self.options.get("fields", "")))

    def streamReader(self, schema) -> RedisStreamReader:
        return RedisStreamReader(self.options, parse_fields(self.options.get("fields", "")))
