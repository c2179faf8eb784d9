"""Bytes per stored record, for the retention figures of docs/RELIABILITY.md ("Retention").

Inserts N rows of each table Backstop grows, shaped like the ones the controller writes, into
the test database and prints the table's growth per row (pg_total_relation_size: heap, indexes
and TOAST) and the average row itself (pg_column_size); and the memory a progress record takes
in a Redis stream (MEMORY USAGE). A measurement, skipped unless asked for, on PostgreSQL only:

    BACKSTOP_ROW_SIZES=1 DATABASE_URL=postgres://postgres@127.0.0.1:5432/backstop \\
        .venv/bin/pytest -p no:cacheprovider tests/console/test_retention_sizes.py -s
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from console.models import (
    ControlDecision,
    FaultInjection,
    Job,
    MetricSample,
    Node,
    RecoveryEpisode,
)
from console.redis import redis_client
from console.services.retention import delete_in_batches
from tests.dash.seed import ERROR_TAIL
from tests.factories import make_job, progress_record

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        os.environ.get("BACKSTOP_ROW_SIZES") != "1",
        reason="a measurement: set BACKSTOP_ROW_SIZES=1 to run it",
    ),
]

N = 20_000


def table_bytes(model) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_total_relation_size(%s)", [model._meta.db_table])
        return cursor.fetchone()[0]


def row_bytes(model) -> float:
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT avg(pg_column_size(t.*)) FROM {table} t")  # noqa: S608
        return float(cursor.fetchone()[0])


def measure(model, rows) -> tuple[float, float]:
    before = table_bytes(model)
    model.objects.bulk_create(rows, batch_size=5000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {model._meta.db_table}")
    return (table_bytes(model) - before) / len(rows), row_bytes(model)


def test_bytes_per_row():
    if connection.vendor != "postgresql":
        pytest.skip("pg_column_size and pg_total_relation_size are PostgreSQL's")
    now = timezone.now()
    job = make_job(Job.Status.RUNNING, name="sizes")
    node = Node.objects.create(name="sizes-node", cpu_total=8, mem_total_mb=16384)
    names = ("throughput_eps", "input_rate_eps", "batch_duration_ms", "state_rows")
    samples = [
        MetricSample(
            at=now - timedelta(milliseconds=500 * (N - i)),  # oldest first, as written
            job=job if i % 5 else None,
            node=None if i % 5 else node,
            stage=("", "split", "count")[i % 3] if i % 5 else "",
            name=names[i % len(names)] if i % 5 else "cpu_util",
            value=1234.5678 + i,
        )
        for i in range(N)
    ]
    decisions = [
        ControlDecision(
            job=job,
            at=now - timedelta(seconds=N - i),
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
        for i in range(N // 4)
    ]
    faults = [
        FaultInjection(
            job=job, kind="kill-driver", target_operator="count", outcome="injected",
            injected_at=now, outcome_detail="SIGKILL sent to pid 12345 on node-07",
        )
        for _ in range(N // 10)
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
        for _ in range(N // 10)
    ]  # fmt: skip
    print()
    for label, model, rows in (
        ("metric sample", MetricSample, samples),
        ("controller decision", ControlDecision, decisions),
        ("fault", FaultInjection, faults),
        ("recovery episode", RecoveryEpisode, episodes),
    ):
        growth, average = measure(model, rows)
        print(f"  {label:20} {growth:7.1f} bytes/row with indexes, {average:6.1f} bytes the row "
              f"itself ({len(rows)} rows)")  # fmt: skip
    # How fast the purge deletes metric samples (batches of RETENTION_BATCH_ROWS, committed
    # each: here savepoints inside the test's transaction).
    more = [
        MetricSample(at=now - timedelta(days=3, milliseconds=i), job=job, stage="",
                     name="throughput_eps", value=float(i))
        for i in range(100_000)
    ]  # fmt: skip
    MetricSample.objects.bulk_create(more, batch_size=10_000)
    old = MetricSample.objects.filter(at__lt=now - timedelta(days=2))
    started = time.monotonic()
    deleted = delete_in_batches(old, 10_000, time.monotonic() + 600)
    elapsed = time.monotonic() - started
    print(f"  purge                {deleted / elapsed:7.0f} metric samples/s deleted "
          f"({deleted} in batches of 10000, {elapsed:.1f} s)")  # fmt: skip
    client = redis_client()
    stream = "backstop:sizes-measurement:progress"
    client.delete(stream)
    record = progress_record(
        replica="count-primary-0", node="node-07", query="job-abc123.count.0", batch=123456,
        at=1_790_000_000.123, input_rows=250, input_rate=49.8, processed_rate=512.3,
        batch_ms=412.0, state_rows=5321, state_memory_bytes=1_234_567, rows_out=37, written=37,
        latency_p50=0.61, latency_p90=0.93, latency_p99=1.4,
    )  # fmt: skip
    try:
        with client.pipeline(transaction=False) as pipe:
            for _ in range(10_000):
                pipe.xadd(stream, record.to_fields())
            pipe.execute()
        memory = client.memory_usage(stream, samples=0)
        print(f"  progress record      {memory / 10_000:7.1f} bytes/entry in a Redis stream "
              f"(10000 entries: {memory / 2**20:.1f} MiB)")  # fmt: skip
    finally:
        client.delete(stream)
