"""`manage.py row_sizes`: bytes per stored record, for the retention figures of
docs/RELIABILITY.md ("Retention").

Inserts `rows` rows of each table Backstop grows, shaped like the ones the controller writes,
and reports the table's growth per row (pg_total_relation_size: heap, indexes and TOAST) and the
average row itself (pg_column_size); how fast the retention purge deletes old metric samples
(console.services.retention.delete_in_batches, in committed batches); and the memory a progress
record takes in a Redis stream (MEMORY USAGE).

PostgreSQL only (the sizes are PostgreSQL's own functions). Nothing of a user's is touched: the
rows go into a database of the run's own on the configured server (bench.scratch, dropped at the
end), and the progress records into a stream of a job key no job has (spark_runtime.keys.progress
of `row-sizes-<random>`), deleted at the end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from console.models import (
    ControlDecision,
    FaultInjection,
    Job,
    MetricSample,
    Node,
    RecoveryEpisode,
    Team,
)
from console.services.jobs import create_job
from console.services.retention import delete_in_batches
from console.services.teams import DEFAULT_TEAM
from spark_runtime import keys as data_keys
from spark_runtime.progress import ProgressRecord

# A failure's decision carries the stage's last log lines, about this long.
ERROR_TAIL = """pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED]
Query [id = 5f1c..., runId = 9a0e...] terminated with exception:
Python worker exited unexpectedly (crashed)
  File "spark_runtime/stage.py", line 212, in run
    query.awaitTermination()
Killed (signal 9)"""
SAMPLE_NAMES = ("throughput_eps", "input_rate_eps", "batch_duration_ms", "state_rows")


@dataclass(frozen=True)
class RowSizeSettings:
    """How many rows of each kind: `rows` metric samples (a quarter as many decisions, a tenth
    as many faults and episodes), `purge_rows` old samples to delete, `stream_entries`
    progress records."""

    rows: int = 20_000
    purge_rows: int = 100_000
    stream_entries: int = 10_000

    def __post_init__(self):
        for name in ("rows", "purge_rows", "stream_entries"):
            if getattr(self, name) < 10:
                raise ValueError(f"{name}: at least 10, not {getattr(self, name)}")


def table_bytes(model) -> int:
    """The table's size on disk with its indexes and TOAST."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s)", [model._meta.db_table])
        return cursor.fetchone()[0]


def average_row_bytes(model) -> float:
    """The average size of the table's rows themselves."""
    with connection.cursor() as cursor:
        table = connection.ops.quote_name(model._meta.db_table)
        cursor.execute(f"SELECT avg(pg_column_size(t.*)) FROM {table} t")  # noqa: S608
        return float(cursor.fetchone()[0])


def measure_table(model, rows: list) -> dict:
    """Insert `rows` as the controller would (bulk) and what each took."""
    before_rows, before_bytes = model.objects.count(), table_bytes(model)
    model.objects.bulk_create(rows, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
    after_rows, after_bytes = model.objects.count(), table_bytes(model)
    return {
        "table": model._meta.db_table,
        "inserted": len(rows),
        "rows_before": before_rows,
        "rows_after": after_rows,
        "bytes_before": before_bytes,
        "bytes_after": after_bytes,
        "bytes_per_row": round((after_bytes - before_bytes) / len(rows), 1),
        "row_bytes": round(average_row_bytes(model), 1),
    }


def _rows(job: Job, node: Node, n: int) -> dict[str, tuple[type, list]]:
    """The rows of each kind, shaped like the controller's."""
    now = timezone.now()
    samples = [
        MetricSample(
            at=now - timedelta(milliseconds=500 * (n - i)),  # oldest first, as written
            job=job if i % 5 else None,
            node=None if i % 5 else node,
            stage=("", "split", "count")[i % 3] if i % 5 else "",
            name=SAMPLE_NAMES[i % len(SAMPLE_NAMES)] if i % 5 else "cpu_util",
            value=1234.5678 + i,
        )
        for i in range(n)
    ]
    decisions = [
        ControlDecision(
            job=job,
            at=now - timedelta(seconds=n - i),
            kind="failure" if i % 10 == 0 else "set-interval",
            operator="count",
            stage="count",
            node="node-07",
            replica_id=f"{job.key}/count-primary-{i}",
            reason=f"{job.key}/count-primary-{i}: ReplicaExited"
            if i % 10 == 0
            else "no fault in the last cycle: interval 5.0 s -> 6.0 s",
            detail={"error_tail": ERROR_TAIL * 4} if i % 10 == 0 else {},
        )
        for i in range(n // 4)
    ]
    faults = [
        FaultInjection(
            job=job, kind="kill-driver", target_operator="count", outcome="injected",
            injected_at=now, outcome_detail="SIGKILL sent to pid 12345 on node-07",
        )
        for _ in range(n // 10)
    ]  # fmt: skip
    episodes = [
        RecoveryEpisode(
            job=job, strategy="adaptive", stage="count", action="promote", detected_at=now,
            recovered_at=now, downtime_s=1.2, recovery_time_s=4.5, peak_p99_ms=2500.0,
            reprotect_s=3.9, watched_s=30.0, reference_from=now, reference_to=now, lost=0,
            duplicates=0,
            notes="standby count-1 promoted on node-07, fencing epoch 3; output audited after "
            "it: 0 lost and 0 duplicated of 48211 results in the job so far (0 and 0 new)",
        )
        for _ in range(n // 10)
    ]  # fmt: skip
    return {
        "metric sample": (MetricSample, samples),
        "controller decision": (ControlDecision, decisions),
        "fault": (FaultInjection, faults),
        "recovery episode": (RecoveryEpisode, episodes),
    }


def measure_purge(job: Job, rows: int) -> dict:
    """`rows` metric samples three days old, deleted as the hourly purge deletes them."""
    now = timezone.now()
    old = [
        MetricSample(at=now - timedelta(days=3, milliseconds=i), job=job, stage="",
                     name="throughput_eps", value=float(i))
        for i in range(rows)
    ]  # fmt: skip
    MetricSample.objects.bulk_create(old, batch_size=10_000)
    batch = min(10_000, rows)
    started = time.monotonic()
    deleted = delete_in_batches(
        MetricSample.objects.filter(at__lt=now - timedelta(days=2)), batch, time.monotonic() + 600
    )
    elapsed = time.monotonic() - started
    return {
        "deleted": deleted,
        "batch_rows": batch,
        "seconds": round(elapsed, 2),
        "rows_per_s": round(deleted / elapsed) if elapsed else None,
    }


def measure_stream(client, entries: int) -> dict:
    """`entries` progress records in a stream of its own: the Redis memory per entry."""
    stream = data_keys.progress(f"row-sizes-{uuid.uuid4().hex}")
    record = ProgressRecord(
        replica="count-primary-0", stage="count", role="primary", node="node-07",
        query="job-abc123.count.0", segment="0", batch=123456, at=1_790_000_000.123,
        input_rows=250, input_rate=49.8, processed_rate=512.3, batch_ms=412.0,
        state_rows=5321, state_memory_bytes=1_234_567, rows_out=37, written=37, final=True,
        buffered=0, latency_p50=0.61, latency_p90=0.93, latency_p99=1.4,
    )  # fmt: skip
    try:
        with client.pipeline(transaction=False) as pipe:
            for _ in range(entries):
                pipe.xadd(stream, record.to_fields())
            pipe.execute()
        memory = client.memory_usage(stream, samples=0)
        return {
            "entries": client.xlen(stream),
            "bytes": memory,
            "bytes_per_entry": round(memory / entries, 1),
            "redis_version": client.info("server")["redis_version"],
        }
    finally:
        client.delete(stream)


def run(settings: RowSizeSettings, redis, say: Callable[[str], None]) -> dict:
    """Every measurement in the current database (the run's own, on PostgreSQL) and in
    `redis`; the report (JSON types)."""
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    job = create_job(
        team=Team.named(DEFAULT_TEAM), name="row-sizes", topology="wordcount",
        strategy=Job.Strategy.ADAPTIVE, params={},
    )  # fmt: skip
    node = Node.objects.create(name="row-sizes-node", cpu_total=8, mem_total_mb=16384)
    tables = {}
    for label, (model, rows) in _rows(job, node, settings.rows).items():
        say(f"inserting {len(rows):,d} rows: {label}")
        tables[label] = measure_table(model, rows)
    say(f"purging {settings.purge_rows:,d} old metric samples")
    purge = measure_purge(job, settings.purge_rows)
    say(f"writing {settings.stream_entries:,d} progress records to a Redis stream")
    stream = measure_stream(redis, settings.stream_entries)
    return {"postgresql": version, "tables": tables, "purge": purge, "progress_record": stream}


def render(report: dict, command: str, when: str) -> str:
    """The figures, as printed and as docs/RELIABILITY.md cites them."""
    lines = [
        f"Measured {when} on PostgreSQL {report['postgresql']}, Redis "
        f"{report['progress_record']['redis_version']}. Command:",
        "",
        f"    {command}",
        "",
        "| record | rows | bytes/row with indexes | bytes the row itself |",
        "|---|---|---|---|",
    ]
    for label, table in report["tables"].items():
        lines.append(
            f"| {label} | {table['inserted']:,d} | {table['bytes_per_row']:.1f} | "
            f"{table['row_bytes']:.1f} |"
        )
    purge, stream = report["purge"], report["progress_record"]
    lines += [
        "",
        f"Purge: {purge['deleted']:,d} metric samples deleted in batches of "
        f"{purge['batch_rows']:,d} in {purge['seconds']:.1f} s ({purge['rows_per_s']:,d} rows/s).",
        f"Progress record: {stream['bytes_per_entry']:.1f} bytes per entry in a Redis stream "
        f"({stream['entries']:,d} entries: {stream['bytes'] / 2**20:.1f} MiB).",
    ]
    return "\n".join(lines)
