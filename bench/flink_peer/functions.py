"""The plain-Python parts of the Flink peer's job (bench/flink_peer/job.py): parsing the bridged
lines and writing results and progress records. No PyFlink import, so they are tested in the
project's environment; the job's functions call them in Flink's Python workers.
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


class InjectedTaskFailure(RuntimeError):
    """The benchmark's task-failure fault (an exception in an operator)."""


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

    def upsert(self, field: str, value: str, event_ts_ms: int, events: int) -> None:
        """Write one result (absolute, so a replay rewrites the same value) covering `events`
        input events, the newest of which has event time `event_ts_ms`."""
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
            latency = percentiles(self.latencies)
            record = ProgressRecord(
                replica=f"flink/{self.operator}/{self.subtask}",
                stage=PROGRESS_STAGE,
                role=PRIMARY,
                node="flink",
                query=self.operator,
                segment="0",
                batch=self.batch,
                at=now,
                input_rows=self.events,
                input_rate=None,
                processed_rate=None,
                batch_ms=None,
                state_rows=0,
                state_memory_bytes=0,
                rows_out=self.writes,
                written=self.writes,
                final=True,
                buffered=0,
                latency_p50=latency["p50"],
                latency_p90=latency["p90"],
                latency_p99=latency["p99"],
            )
            publish_progress(self.client, self.job, record)
            self.batch += 1
        self.latencies, self.events, self.writes, self.flushed_at = [], 0, 0, now
        if self.client.getdel(keys.flink_task_fault(self.job)) is not None:
            raise InjectedTaskFailure(f"injected task failure in {self.operator}/{self.subtask}")


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
