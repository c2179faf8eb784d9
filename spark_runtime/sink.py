"""Idempotent, fenced writes of a stage's output to Redis.

Every output record carries a *version*: the input offset it derives from (`pos`, see
redis_source) and its ordinal `k` among the outputs of that input, as a fixed-width string so
that Lua compares versions as strings. Two kinds of sink:

- stream sinks (intermediate channels, emitted records): a record is appended only if its version
  is above the stage's watermark for that sink, and the watermark moves up in the same script.
  Records are written in version order, so a batch re-executed after a crash writes exactly the
  part the crashed run had not written.
- hash sinks (final results): an upsert of the absolute value per key, applied only if its version
  is above the version stored for that key. Re-applying old values is a no-op.

Both scripts first compare the writer's fencing epoch with `backstop:{job}:fence:{stage}` and
refuse the whole call if they differ: a primary that has been replaced can no longer write.
The per-sink watermark also tells a promoted standby where the primary stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_runtime import keys

CHUNK = 2000  # records per script call: bounds how long Redis is blocked by one call

# The epoch of a stage whose job lost its data in Redis (console/policy/redis_loss.py): no
# writer holds it, so every write is refused, and INCR fails on it, so no replica can take over.
FENCE_LOST = "lost"

FENCE_CHECK = """
local current = redis.call('GET', KEYS[1]) or '0'
if current ~= ARGV[1] then
  return redis.error_reply('FENCED stage epoch is ' .. current .. ', writer has ' .. ARGV[1])
end
"""

# KEYS: fence, watermarks hash, stream. ARGV: epoch, sink, then per record:
# version, number of field/value pairs, pairs...
EMIT_STREAM_LUA = (
    FENCE_CHECK
    + """
local wm = redis.call('HGET', KEYS[2], ARGV[2]) or ''
local written = 0
local i = 3
while i <= #ARGV do
  local version = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  if version > wm then
    local args = {}
    for j = 1, 2 * n do args[j] = ARGV[i + 1 + j] end
    redis.call('XADD', KEYS[3], '*', unpack(args))
    wm = version
    written = written + 1
  end
  i = i + 2 + 2 * n
end
if wm ~= '' then redis.call('HSET', KEYS[2], ARGV[2], wm) end
return written
"""
)

# KEYS: fence, watermarks hash, values hash, versions hash. ARGV: epoch, sink, mark, then triples
# field, value, version. Mark '' moves the watermark to the highest version written (rows carry
# their own input offsets); otherwise the rows leave it alone and it moves to the mark at the
# end ('-': not in this call; see FencedWriter.upsert_hash).
UPSERT_HASH_LUA = (
    FENCE_CHECK
    + """
local wm = redis.call('HGET', KEYS[2], ARGV[2]) or ''
local mark = ARGV[3]
local written = 0
for i = 4, #ARGV, 3 do
  local field, value, version = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local old = redis.call('HGET', KEYS[4], field)
  if (not old) or version > old then
    redis.call('HSET', KEYS[3], field, value)
    redis.call('HSET', KEYS[4], field, version)
    written = written + 1
  end
  if mark == '' and version > wm then wm = version end
end
if mark ~= '' and mark ~= '-' and mark > wm then wm = mark end
if wm ~= '' then redis.call('HSET', KEYS[2], ARGV[2], wm) end
return written
"""
)

# KEYS: fence, watermarks hash, stream, set of written keys. ARGV: epoch, sink, mark ('-' or the
# watermark to set at the end), then per record: key, number of field/value pairs, pairs...
# A record whose key was written before is dropped.
EMIT_KEYED_LUA = (
    FENCE_CHECK
    + """
local written = 0
local i = 4
while i <= #ARGV do
  local n = tonumber(ARGV[i + 1])
  if redis.call('SADD', KEYS[4], ARGV[i]) == 1 then
    local args = {}
    for j = 1, 2 * n do args[j] = ARGV[i + 1 + j] end
    redis.call('XADD', KEYS[3], '*', unpack(args))
    written = written + 1
  end
  i = i + 2 + 2 * n
end
local wm = redis.call('HGET', KEYS[2], ARGV[2]) or ''
if ARGV[3] ~= '-' and ARGV[3] > wm then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
return written
"""
)


class FencedError(RuntimeError):
    """The stage's fencing epoch moved on: this replica is no longer its primary."""


def version(pos: int, k: int = 0) -> str:
    """The version string of the `k`-th output derived from the input at `pos`."""
    return f"{pos:020d}{k:06d}"


@dataclass
class StreamRecord:
    """One record for a stream sink."""

    version: str
    fields: dict


@dataclass
class HashRow:
    """One absolute value for a hash sink."""

    version: str
    field: str
    value: str


class FencedWriter:
    """Writes a stage's outputs under a fencing epoch. Used on the Spark driver (foreachBatch)."""

    def __init__(self, client, job: str, stage: str, epoch: int = 0):
        self.client = client
        self.job = job
        self.stage = stage
        self.epoch = epoch
        self._emit = client.register_script(EMIT_STREAM_LUA)
        self._upsert = client.register_script(UPSERT_HASH_LUA)
        self._emit_keyed = client.register_script(EMIT_KEYED_LUA)

    def acquire(self) -> int:
        """Become the stage's writer: bump the fencing epoch, which fences every older writer."""
        self.epoch = int(self.client.incr(keys.fence(self.job, self.stage)))
        return self.epoch

    def watermark(self, sink: str) -> str:
        """The highest version written to `sink` by this stage ('' if none)."""
        return self.client.hget(keys.watermarks(self.job, self.stage), sink) or ""

    def _call(self, script, script_keys, args) -> int:
        import redis

        try:
            return int(script(keys=script_keys, args=args))
        except redis.exceptions.ResponseError as exc:
            if "FENCED" in str(exc):
                raise FencedError(str(exc)) from None
            raise

    def emit_stream(self, sink: str, stream_key: str, records: list[StreamRecord]) -> int:
        """Append the records above the sink's watermark, in version order; returns how many."""
        records = sorted(records, key=lambda r: r.version)
        script_keys = [keys.fence(self.job, self.stage), keys.watermarks(self.job, self.stage)]
        script_keys.append(stream_key)
        written = 0
        for start in range(0, len(records), CHUNK):
            args = [str(self.epoch), sink]
            for rec in records[start : start + CHUNK]:
                args.append(rec.version)
                args.append(len(rec.fields))
                for name, value in rec.fields.items():
                    args.append(name)
                    args.append(str(value))
            written += self._call(self._emit, script_keys, args)
        return written

    def upsert_hash(
        self,
        sink: str,
        hash_key: str,
        version_key: str,
        rows: list[HashRow],
        batch_watermark: str | None = None,
    ) -> int:
        """Set each row's value if its version is newer than the stored one; returns how many.

        Rows go in version order so that, after any chunk, the watermark never exceeds a version
        that has not been written (the standby relies on that to trim its buffer). With
        `batch_watermark` (user jobs: every row of a batch has the batch's version) the watermark
        moves to it only after the last chunk, when the whole batch is in Redis.
        """
        rows = sorted(rows, key=lambda r: r.version)
        script_keys = [
            keys.fence(self.job, self.stage),
            keys.watermarks(self.job, self.stage),
            hash_key,
            version_key,
        ]
        written = 0
        # A batch without rows still moves the watermark: its input is fully handled.
        starts = range(0, len(rows) if batch_watermark is None else max(1, len(rows)), CHUNK)
        for start in starts:
            mark = "" if batch_watermark is None else "-"
            if batch_watermark is not None and start == starts[-1]:
                mark = batch_watermark
            args = [str(self.epoch), sink, mark]
            for row in rows[start : start + CHUNK]:
                args += [row.field, row.value, row.version]
            written += self._call(self._upsert, script_keys, args)
        return written

    def emit_keyed(
        self,
        sink: str,
        stream_key: str,
        records: list[StreamRecord],
        key_field: str,
        batch_watermark: str,
    ) -> int:
        """Append each record whose `key_field` value was never written to this stream (a set
        of written keys sits next to it); the watermark moves to `batch_watermark` after the
        last chunk. Returns how many records were appended."""
        script_keys = [
            keys.fence(self.job, self.stage),
            keys.watermarks(self.job, self.stage),
            stream_key,
            keys.written_keys(self.job, sink),
        ]
        written = 0
        starts = range(0, max(1, len(records)), CHUNK)
        for start in starts:
            mark = batch_watermark if start == starts[-1] else "-"
            args = [str(self.epoch), sink, mark]
            for rec in records[start : start + CHUNK]:
                args += [rec.fields[key_field], len(rec.fields)]
                for name, value in rec.fields.items():
                    args += [name, str(value)]
            written += self._call(self._emit_keyed, script_keys, args)
        return written
