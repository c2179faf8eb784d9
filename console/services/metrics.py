"""Moving metrics from Redis into MetricSample rows, in batches, from where the last run stopped.

Sources: the data plane's progress stream of each job (`backstop:{job}:progress`, one record per
micro-batch of each replica) and each node agent's usage stream (`backstop:node:{name}:metrics`).
A cursor per stream (the last stream id read) is kept in Redis, so ingestion is idempotent across
controller restarts: a batch re-read after a crash is skipped by its id. What one ingest reads
(a policy cycle's progress records, a watchdog run's agent samples) becomes one row per metric
and stage or node, not one per record: at fleet size a row per micro-batch was most of the
database's writes (docs/RESULTS.md, "Fleet scale").

Metric names written (MetricSample.name):
- job level (stage ""): `throughput_eps`, `input_rate_eps`, `latency_p50_ms`, `latency_p90_ms`,
  `latency_p99_ms` (event time to output, final stage only), `batch_duration_ms`;
- stage level (stage = stage name): `throughput_eps`, `input_rate_eps`, `batch_duration_ms`,
  `state_rows`, `state_memory_bytes`;
- node level: `cpu_util`, `mem_util`, `disk_util`, `net_util` (fractions 0..1), `cpu_idle`,
  `mem_idle`, `disk_idle`, `bw_idle`, and `q_score` (written once per watchdog run,
  console.services.control.observe.update_nodes).
"""

from __future__ import annotations

import json

from console.clock import utc
from console.models import Job, MetricSample, Node
from console.policy.resources import NodeSample, idle_rates
from infra import keys as control_keys
from infra.node_metrics import RESOURCE_FIELDS
from spark_runtime import keys as data_keys
from spark_runtime.progress import ProgressRecord

READ_BATCH = 2000


def _read_new(client, stream: str) -> list[tuple[str, dict]]:
    """Entries of `stream` after the stored cursor (at most READ_BATCH); advances nothing yet."""
    cursor = client.get(control_keys.ingest_cursor(stream)) or "0-0"
    return client.xrange(stream, min=f"({cursor}", count=READ_BATCH)


def progress_after(client, job_key: str, after: str | None) -> tuple[list[ProgressRecord], str]:
    """The job's progress records after entry `after` (None: after what was last stored as
    samples), at most READ_BATCH, and the id to ask after next time. Reads only: the looks
    between policy cycles see the new records without storing them (the cycle does)."""
    stream = data_keys.progress(job_key)
    if after is None:
        after = client.get(control_keys.ingest_cursor(stream)) or "0-0"
    entries = client.xrange(stream, min=f"({after}", count=READ_BATCH)
    records = [ProgressRecord.from_fields(fields) for _, fields in entries]
    return records, (entries[-1][0] if entries else after)


def _advance(client, stream: str, entries: list[tuple[str, dict]]) -> None:
    if entries:
        client.set(control_keys.ingest_cursor(stream), entries[-1][0])


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _mean(values) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _max(values) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def progress_samples(job: Job, records: list[ProgressRecord]) -> list[MetricSample]:
    """MetricSample rows for the progress records of one ingest (a policy cycle's worth),
    one row per metric and stage rather than one per micro-batch: at fleet size, rows per
    batch were most of the database's writes. Standbys are skipped (their output is held
    back, so their rates are not the job's). Per stage: rates and batch duration are the mean
    of its batches', state size the newest batch's; job level (the final stage): the same
    rates, the mean p50 latency, and the worst p90 and p99 of the batches. Each row is dated
    at the newest batch it covers."""
    by_stage: dict[str, list[ProgressRecord]] = {}
    for record in records:
        if record.is_primary:
            by_stage.setdefault(record.stage, []).append(record)
    rows = []
    for stage, mine in by_stage.items():
        mine.sort(key=lambda r: r.at)
        newest = mine[-1]
        at = utc(newest.at)
        stage_metrics = {
            "throughput_eps": _mean(r.processed_rate for r in mine),
            "input_rate_eps": _mean(r.input_rate for r in mine),
            "batch_duration_ms": _mean(r.batch_ms for r in mine),
            "state_rows": float(newest.state_rows),
            "state_memory_bytes": float(newest.state_memory_bytes),
        }
        for name, value in stage_metrics.items():
            if value is not None:
                rows.append(MetricSample(at=at, job=job, stage=stage, name=name, value=value))
        final = [r for r in mine if r.final]
        if not final:
            continue
        job_metrics = {
            "throughput_eps": _mean(r.processed_rate for r in final),
            "input_rate_eps": _mean(r.input_rate for r in final),
            "batch_duration_ms": _mean(r.batch_ms for r in final),
            "latency_p50_ms": _ms(_mean(r.latency_p50 for r in final)),
            "latency_p90_ms": _ms(_max(r.latency_p90 for r in final)),
            "latency_p99_ms": _ms(_max(r.latency_p99 for r in final)),
        }
        at = utc(final[-1].at)
        for name, value in job_metrics.items():
            if value is not None:
                rows.append(MetricSample(at=at, job=job, stage="", name=name, value=value))
    return rows


def ingest_job_progress(
    client, job: Job, also: list | None = None, records_out: list | None = None
) -> int:
    """Store the job's new progress records as MetricSample rows, with the rows of `also` (the
    policy cycle's, so one insert serves both); return how many progress rows. The stream's
    cursor moves only once the rows are in. `records_out`, when given, is extended with the
    records read (the alert conditions look at them: console.services.control.record)."""
    stream = data_keys.progress(job.key)
    entries = _read_new(client, stream)
    records = [ProgressRecord.from_fields(fields) for _, fields in entries]
    if records_out is not None:
        records_out.extend(records)
    rows = progress_samples(job, records)
    MetricSample.objects.bulk_create([*rows, *(also or [])], batch_size=500)
    _advance(client, stream, entries)
    return len(rows)


def node_sample_from_usage(name: str, usage: dict) -> NodeSample:
    """The policy's view of one agent sample."""
    return NodeSample(name, **{field: usage[field] for field in RESOURCE_FIELDS})


def usage_samples(node: Node, usages: list[dict]) -> list[MetricSample]:
    """MetricSample rows for the agent samples of one ingest (a watchdog run's worth): the
    mean utilisation and idle rates, and the newest count of warm spares, one row per metric,
    dated at the newest sample."""
    if not usages:
        return []
    rates = [idle_rates(node_sample_from_usage(node.name, usage)) for usage in usages]
    at = utc(max(float(usage["at"]) for usage in usages))
    values = {
        "cpu_util": 1 - _mean(r.cpu for r in rates),
        "mem_util": 1 - _mean(r.mem for r in rates),
        "disk_util": 1 - _mean(r.disk for r in rates),
        "net_util": 1 - _mean(r.bw for r in rates),
        "cpu_idle": _mean(r.cpu for r in rates),
        "mem_idle": _mean(r.mem for r in rates),
        "disk_idle": _mean(r.disk for r in rates),
        "bw_idle": _mean(r.bw for r in rates),
        # Idle warm spares the agent keeps (pre-started stage processes).
        "warm_spares": float(usages[-1].get("spares", 0)),
    }
    return [MetricSample(at=at, node=node, name=k, value=round(v, 4)) for k, v in values.items()]


def read_node_metrics(client, node: Node) -> tuple[list[MetricSample], list[tuple[str, dict]]]:
    """A node's usage samples not stored yet, as rows, with the stream entries they came from
    (hand both to `store_node_metrics` once the rows of every node are collected)."""
    stream = control_keys.node_metrics(node.name)
    entries = _read_new(client, stream)
    usages = [json.loads(fields["sample"]) for _, fields in entries]
    return usage_samples(node, usages), entries


def store_node_metrics(client, rows: list[MetricSample], read: dict[str, list]) -> None:
    """Insert the rows of every node at once, then advance each node's stream cursor
    (`read`: node name -> its entries), so a crash between the two re-reads, never skips."""
    MetricSample.objects.bulk_create(rows, batch_size=500)
    for name, entries in read.items():
        _advance(client, control_keys.node_metrics(name), entries)


def recent_node_usages(client, node_names: list[str], count: int) -> dict[str, list[dict]]:
    """Each node's newest `count` usage samples, newest first (the Q score's history), in one
    round trip: a controller reads every node's each second."""
    with client.pipeline(transaction=False) as pipe:
        for name in node_names:
            pipe.xrevrange(control_keys.node_metrics(name), count=count)
        streams = pipe.execute()
    return {name: _usages(entries) for name, entries in zip(node_names, streams, strict=True)}


def _usages(entries) -> list[dict]:
    usages = []
    for _, fields in entries:
        # One malformed entry must not hide the node's other samples (nor fail the fleet view).
        try:
            usage = json.loads(fields["sample"])
        except (KeyError, TypeError, ValueError):
            continue
        if isinstance(usage, dict):
            usages.append(usage)
    return usages
