"""Seeded, rate-controlled input generators, one per topology.

Each writes entries to `backstop:{job}:in` with `id` (unique), `ts` (event time: the wall clock
at generation, epoch ms, so that end-to-end latency can be measured) and the topology's payload:

- wordcount: `text`, 3-12 words from a skewed vocabulary of 200 words;
- topn: `item`, one of 50 items with Zipf-like frequencies;
- traffic: `kind` (speed|flow), `sensor` (a location), `lane`, `value` (integer km/h or vehicles);
  every wall-clock second gets exactly one speed and one flow measurement per sensor lane, so the
  join per (sensor, lane, second) is well defined;
- shuffle: `value`, an integer 0-999;
- a user job (`NAME@VERSION`): what its JobDefinition's `generate` returns.

`malformed_every=N` makes every N-th entry malformed (missing id, non-integer ts, or missing
payload field, in turn) to exercise the dead-letter path.

`generate_to_kafka` writes the same records to a Kafka topic instead (a job with a Kafka
source): JSON objects keyed by `id`, with the event time as the record's timestamp.
"""

from __future__ import annotations

import json
import logging
import random
import time

import redis
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from spark_runtime import keys
from spark_runtime.jobdef import is_registered_ident, resolve_topology
from spark_runtime.kafka_read import CLIENT_LOG, RECONNECT_BACKOFF_MAX_MS


def generator_replica_id(job_key: str) -> str:
    """The replica id a job's input generator runs under (on whichever node runs it)."""
    return f"generator-{job_key}"


log = logging.getLogger(__name__)


def wait_for_redis(client, stream: str, error: Exception, poll_s: float = 1.0) -> int:
    """Block until Redis answers again after `error`; return the length of `stream` then."""
    log.warning("Redis unreachable (%s): waiting for it", error)
    while True:
        try:
            return client.xlen(stream)
        except redis.ConnectionError:
            time.sleep(poll_s)


class InputLost(RuntimeError):
    """Redis came back without the input stream: it lost its data. Writing the input again from
    the start would give it new entry ids, which a stage resumed from its checkpoint would count
    a second time, so the generator stops (docs/RELIABILITY.md, "Redis without its data")."""


# Within this long of its first write, a stream the append-only file lost whole (up to a second
# of writes with `appendfsync everysec`) is written again, not taken for a Redis without data.
YOUNG_STREAM_S = 2.0


def stream_lost(length_after: int, length_at_start: int, first_write_at, now: float) -> bool:
    """Whether a stream found empty after a Redis outage was lost with Redis's data: it held
    entries when the generator started, or held them for longer than a crash can lose."""
    if length_after > 0:
        return False
    held_long = first_write_at is not None and now - first_write_at > YOUNG_STREAM_S
    return length_at_start > 0 or held_long


VOCABULARY = [f"w{i:03d}" for i in range(200)]
WORD_WEIGHTS = [1.0 / (i + 1) ** 0.8 for i in range(len(VOCABULARY))]
ITEMS = [f"item{i:02d}" for i in range(50)]
ITEM_WEIGHTS = [1.0 / (i + 1) for i in range(len(ITEMS))]
LANES = 4


class _Traffic:
    """Emits rounds of measurements: one round per wall-clock second, covering every sensor lane."""

    def __init__(self, rng: random.Random, rate: float):
        self.rng = rng
        pairs = max(LANES, int(rate // 2))
        self.sensors = [f"L{i:03d}" for i in range(max(1, pairs // LANES))]
        self.round: list[dict] = []
        self.second = 0

    def next(self, now_ms: int) -> dict:
        if not self.round:
            # A new round belongs to the current second, or to the next one if this second has
            # been used already: a sensor lane never gets two measurements of a kind per second.
            self.second = max(now_ms // 1000, self.second + 1)
            for sensor in self.sensors:
                for lane in range(LANES):
                    speed = self.rng.randint(40, 130)
                    flow = self.rng.randint(0, 30)
                    self.round.append(
                        {"kind": "speed", "sensor": sensor, "lane": lane, "value": speed}
                    )
                    self.round.append(
                        {"kind": "flow", "sensor": sensor, "lane": lane, "value": flow}
                    )
            self.round.reverse()
        fields = self.round.pop()
        ts = min(max(now_ms, self.second * 1000), self.second * 1000 + 999)
        return {**fields, "ts": ts}


def make_payload_factory(topology: str, rng: random.Random, rate: float):
    """A function `now_ms -> fields` (payload and ts) for `topology` (a user job's `generate`
    for `NAME@VERSION`)."""
    if is_registered_ident(topology):
        user_payload = resolve_topology(topology).job.generate
        if user_payload is None:
            raise KeyError(f"job {topology!r} declares no generator (JobDefinition.generate)")
        return lambda now_ms: {"ts": now_ms, **user_payload(rng)}
    if topology == "wordcount":

        def words(now_ms: int) -> dict:
            n = rng.randint(3, 12)
            return {"ts": now_ms, "text": " ".join(rng.choices(VOCABULARY, WORD_WEIGHTS, k=n))}

        return words
    if topology == "topn":
        return lambda now_ms: {"ts": now_ms, "item": rng.choices(ITEMS, ITEM_WEIGHTS)[0]}
    if topology == "traffic":
        return _Traffic(rng, rate).next
    if topology == "shuffle":
        return lambda now_ms: {"ts": now_ms, "value": rng.randint(0, 999)}
    raise KeyError(f"no generator for topology {topology!r}")


def _malform(fields: dict, n: int) -> dict:
    bad = dict(fields)
    kind = n % 3
    if kind == 0:
        bad.pop("id")
    elif kind == 1:
        bad["ts"] = "not-a-number"
    else:
        payload = [k for k in bad if k not in ("id", "ts")]
        bad.pop(payload[0])
    return bad


def entries_due(rate, elapsed, sent, resumed_at, count, duration, stop) -> int | None:
    """How many entries a generator at `rate` should write now, `elapsed` seconds after it
    started with `resumed_at` already written and `sent` written so far (<= 0: none yet);
    None once it is done (`duration` over, `count` reached, or `stop()` true)."""
    if duration is not None and elapsed >= duration:
        return None
    if count is not None and sent >= count:
        return None
    if stop is not None and stop():
        return None
    due = int(rate * elapsed) + 1 - (sent - resumed_at)
    return due if count is None else min(due, count - sent)


def generate(
    client,
    job: str,
    topology: str,
    count: int | None = None,
    rate: float = 1000.0,
    seed: int = 0,
    duration: float | None = None,
    malformed_every: int = 0,
    id_prefix: str = "e",
    stop=None,
    resume: bool = False,
) -> int:
    """Write entries to the job's input stream at `rate` entries/s until `count` entries or
    `duration` seconds (or `stop()` returns True). Returns how many were written.

    With `resume`, the stream's length counts as already written: a generator started again
    (after its node agent or the controller was restarted) goes on from there with the next ids
    and stops at the same `count`, so a repeated start never duplicates input.

    A Redis outage (a restart) does not end it: when a write fails on the connection, it waits
    until Redis answers and counts what the stream holds as written, so entries the outage lost
    are written again (with the same ids) and none is written twice. `client` should not retry
    writes on its own (spark_runtime.redis_client.connect(url, ride_out_outages=False)): a
    retried pipeline whose first run reached Redis would add its entries twice. A Redis that
    comes back without the stream at all lost its data: InputLost is raised (`stream_lost`)."""
    rng = random.Random(seed)
    payload = make_payload_factory(topology, rng, rate)
    stream = keys.input_stream(job)
    started = time.time()
    last_log = started
    length = client.xlen(stream)
    sent = length if resume else 0
    resumed_at = sent
    # Entries in the stream that this run did not write (none with `resume`).
    not_ours = length - sent
    first_write_at = None
    while True:
        now = time.time()
        elapsed = now - started
        due = entries_due(rate, elapsed, sent, resumed_at, count, duration, stop)
        if due is None:
            break
        if due <= 0:
            time.sleep(0.01)
            continue
        pipe = client.pipeline(transaction=False)
        now_ms = int(now * 1000)
        for _ in range(min(due, 5000)):
            fields = {"id": f"{id_prefix}{sent}", **payload(now_ms)}
            if malformed_every and sent % malformed_every == malformed_every - 1:
                fields = _malform(fields, sent // malformed_every)
            pipe.xadd(stream, {k: str(v) for k, v in fields.items()})
            sent += 1
        try:
            pipe.execute()
            first_write_at = first_write_at or now
        except redis.ConnectionError as exc:
            length_after = wait_for_redis(client, stream, exc)
            if stream_lost(length_after, length, first_write_at, time.time()):
                raise InputLost(
                    f"Redis came back without the input stream of {job} ({sent} entries "
                    "written): it lost its data; not writing the input again"
                ) from exc
            written = length_after - not_ours
            log.warning("generator %s: %s of %s entries reached the stream", job, written, sent)
            sent = written
        if now - last_log >= 5:
            log.info("generator %s: %s entries in %.0f s", job, sent, elapsed)
            last_log = now
    return sent - resumed_at


# Field of keys.stats: records in a job's Kafka input topic when its generator last finished.
GENERATED = "generated"


def _malformed_value(fields: dict, n: int) -> bytes:
    """Every kind of value a Kafka source must dead-letter, in turn: not JSON, not a JSON
    object, a payload field missing."""
    kind = n % 3
    if kind == 0:
        return b"\xffnot json"
    if kind == 1:
        return json.dumps([fields]).encode()
    bad = dict(fields)
    bad.pop([k for k in bad if k not in ("id", "ts")][0])
    return json.dumps(bad).encode()


def topic_record_count(bootstrap: str, topic: str, timeout_s: float = 10.0) -> int:
    """Offsets in `topic` (the sum of its partitions' end offsets)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=timeout_s).topics[topic]
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in meta.partitions}
    futures = admin.list_offsets(request, request_timeout=timeout_s)
    return sum(f.result().offset for f in futures.values())


def generate_to_kafka(
    bootstrap: str,
    topic: str,
    topology: str,
    count: int | None = None,
    rate: float = 1000.0,
    seed: int = 0,
    duration: float | None = None,
    malformed_every: int = 0,
    id_prefix: str = "e",
    stop=None,
    resume: bool = False,
) -> int:
    """`generate`, into a Kafka topic: JSON values `{"id", "ts", payload...}` keyed by `id`
    (so they spread over the partitions), the record's timestamp set to `ts`. With `resume`,
    the topic's records count as written. The producer is idempotent (a retried send is not
    written twice) and waits out a broker that is away. Returns how many records it wrote."""
    rng = random.Random(seed)
    payload = make_payload_factory(topology, rng, rate)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "logger": CLIENT_LOG,
            # what it buffered while a broker was away goes out within a second of its return
            "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
        }
    )
    sent = topic_record_count(bootstrap, topic) if resume else 0
    resumed_at = sent
    started = last_log = time.time()
    while True:
        now = time.time()
        elapsed = now - started
        due = entries_due(rate, elapsed, sent, resumed_at, count, duration, stop)
        if due is None:
            break
        if due <= 0:
            producer.poll(0.01)
            continue
        now_ms = int(now * 1000)
        for _ in range(min(due, 5000)):
            fields = {"id": f"{id_prefix}{sent}", **payload(now_ms)}
            if malformed_every and sent % malformed_every == malformed_every - 1:
                value = _malformed_value(fields, sent // malformed_every)
            else:
                value = json.dumps(fields).encode()
            while True:
                try:
                    producer.produce(topic, key=fields["id"], value=value, timestamp=fields["ts"])
                    break
                except BufferError:  # the local queue is full (a broker away): let it drain
                    producer.poll(0.5)
            sent += 1
        producer.poll(0)
        if now - last_log >= 5:
            log.info("generator %s: %s records in %.0f s", topic, sent, elapsed)
            last_log = now
    producer.flush()
    return sent - resumed_at
