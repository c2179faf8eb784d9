"""The plain-Python parts of the Flink peer's job (bench/flink_peer/job.py): parsing the input
lines (the bridge's, or a Kafka input topic's values: the same JSON objects), writing results
and progress records (Redis), or the output topic's records and the Kafka clients' properties
(Kafka). No PyFlink import, so they are tested in the project's environment; the job's functions
call them in Flink's Python workers.
"""

from __future__ import annotations

import json
import re
import time

from spark_runtime import keys
from spark_runtime.progress import PRIMARY, ProgressRecord, percentiles, publish_progress
from spark_runtime.redis_client import connect

FLUSH_S = 0.25  # how often a writing subtask publishes a progress record (and checks the flag)
# The stage every progress record of the job names (the benchmark measures the job by it).
PROGRESS_STAGE = "flink"


# Versions of the output topic's records, zero-padded as wide as Backstop's sinks write theirs:
# a reader of the topic orders a key's versions as strings (bench/strategy/topics.py,
# `read_output`), so these sort as numbers do.
VERSION_DIGITS = 26
# The KafkaSink's transaction timeout: longer than a checkpoint interval plus a restart (Flink's
# advice), within the broker's transaction.max.timeout.ms (15 min by default). Flink's own
# default, 1 h, is refused by a broker with Kafka's defaults.
TRANSACTION_TIMEOUT_MS = 600_000


class InjectedTaskFailure(RuntimeError):
    """The benchmark's task-failure fault (an exception in an operator)."""


def take_task_fault(client, job: str, operator: str, subtask: int) -> None:
    """Raise if the job's task-fault flag is set, taking it (GETDEL: one subtask takes it)."""
    if client.getdel(keys.flink_task_fault(job)) is not None:
        raise InjectedTaskFailure(f"injected task failure in {operator}/{subtask}")


def progress_record(
    replica: str, query: str, batch: int, at: float, events: int, writes: int, latencies: list
) -> ProgressRecord:
    """The progress record of `writes` results covering `events` input events, published at
    `at` with the event-time latencies (s) of the results: a final stage's primary output, as
    the console's recovery measurement reads Backstop's."""
    latency = percentiles(latencies)
    return ProgressRecord(
        replica=replica,
        stage=PROGRESS_STAGE,
        role=PRIMARY,
        node="flink",
        query=query,
        segment="0",
        batch=batch,
        at=at,
        input_rows=events,
        input_rate=None,
        processed_rate=None,
        batch_ms=None,
        state_rows=0,
        state_memory_bytes=0,
        rows_out=writes,
        written=writes,
        final=True,
        buffered=0,
        latency_p50=latency["p50"],
        latency_p90=latency["p90"],
        latency_p99=latency["p99"],
    )


class ResultWriter:
    """Upserts results and publishes progress records for one subtask of a writing operator."""

    def __init__(self, redis_url: str, job: str, operator: str, subtask: int):
        self.client = connect(redis_url)
        self.job = job
        self.operator = operator
        self.subtask = subtask
        self.latencies: list[float] = []
        self.events = 0
        self.writes = 0
        self.flushed_at = time.time()
        self.batch = 0

    def upsert(
        self, field: str, value: str, event_ts_ms: int, events: int, version: int = 0
    ) -> None:
        """Write one result (absolute, so a replay rewrites the same value) covering `events`
        input events, the newest of which has event time `event_ts_ms` (`version`: unused
        here, see TopicResultWriter)."""
        self.client.hset(keys.results(self.job), field, value)
        now = time.time()
        self.latencies.append(now - event_ts_ms / 1000.0)
        self.events += events
        self.writes += 1
        if now - self.flushed_at >= FLUSH_S:
            self.flush(now)

    def flush(self, now: float) -> None:
        """Publish what was written since the last flush, then raise if a fault was injected."""
        if self.writes:
            record = progress_record(
                f"flink/{self.operator}/{self.subtask}", self.operator, self.batch, now,
                self.events, self.writes, self.latencies,
            )  # fmt: skip
            publish_progress(self.client, self.job, record)
            self.batch += 1
        self.latencies, self.events, self.writes, self.flushed_at = [], 0, 0, now
        take_task_fault(self.client, self.job, self.operator, self.subtask)


def result_record(key: str, value: str, version: int, event_ts_ms: int, events: int) -> str:
    """One result as the output topic's record value: `{"key", "value", "version"}` as Backstop's
    Kafka sink writes results (spark_runtime/kafka_sink.py, `record_of`), plus the newest event
    time it covers (`ts`, epoch ms) and the input events it covers (`events`), from which the
    harness measures the output as a reader of the topic sees it (kafka_io.OutputWatcher)."""
    return json.dumps(
        {
            "key": key,
            "value": value,
            "version": f"{version:0{VERSION_DIGITS}d}",
            "ts": event_ts_ms,
            "events": events,
        }
    )


class TopicResultWriter:
    """The results of one subtask of a writing operator as records for the job's KafkaSink.

    `upsert` returns the record the operator emits; Flink's sink writes it in the transaction
    that the next completed checkpoint commits, so a reader with read_committed sees it only
    then: the progress records are the harness's, from what such a reader sees
    (kafka_io.OutputWatcher), not the operator's. The task-fault flag is still looked at every
    `FLUSH_S` (`flush`, also called by the operator's timer)."""

    def __init__(self, redis_url: str, job: str, operator: str, subtask: int):
        self.client = connect(redis_url)
        self.job = job
        self.operator = operator
        self.subtask = subtask
        self.flushed_at = time.time()

    def upsert(self, field: str, value: str, event_ts_ms: int, events: int, version: int) -> str:
        """The record of one result (`version`: increasing per result key, from the operator's
        keyed state, so a replay after a restore gives the same versions again)."""
        now = time.time()
        if now - self.flushed_at >= FLUSH_S:
            self.flush(now)
        return result_record(field, value, version, event_ts_ms, events)

    def flush(self, now: float) -> None:
        self.flushed_at = now
        take_task_fault(self.client, self.job, self.operator, self.subtask)


def kafka_source_properties() -> dict[str, str]:
    """The KafkaSource's consumer properties beyond Flink's: committed records only, as
    Backstop's Kafka source reads (spark_runtime/kafka_read.py)."""
    return {"isolation.level": "read_committed"}


def kafka_sink_properties() -> dict[str, str]:
    """The KafkaSink's producer properties beyond Flink's (`TRANSACTION_TIMEOUT_MS`)."""
    return {"transaction.timeout.ms": str(TRANSACTION_TIMEOUT_MS)}


def split_line(line: str):
    """(word, event ts, first) per word of an input line, as Backstop's split numbers them:
    lower-cased, split on ASCII whitespace, empty words dropped."""
    entry = json.loads(line)
    words = [w for w in re.split(r"\s+", entry.get("text", "").lower(), flags=re.ASCII) if w]
    ts = int(entry["ts"])
    for position, word in enumerate(words):
        yield word, ts, 1 if position == 0 else 0


def window_item(line: str, window_ms: int):
    """(window start ms, item, event ts) of an input line; tumbling windows align to the epoch."""
    entry = json.loads(line)
    ts = int(entry["ts"])
    return ts - ts % window_ms, entry["item"], ts
