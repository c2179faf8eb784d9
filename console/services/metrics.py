"""Moving metrics from Redis into MetricSample rows, in batches, from where the last run stopped.

Sources: the data plane's progress stream of each job (`backstop:{job}:progress`, one record per
micro-batch of each replica) and each node agent's usage stream (`backstop:node:{name}:metrics`).
A cursor per stream (the last stream id read) is kept in Redis, so ingestion is idempotent across
controller restarts: a batch re-read after a crash is skipped by its id.

Metric names written (MetricSample.name):
- job level (stage ""): `throughput_eps`, `input_rate_eps`, `latency_p50_ms`, `latency_p90_ms`,
  `latency_p99_ms` (event time to output, final stage only), `batch_duration_ms`;
- stage level (stage = stage name): `throughput_eps`, `input_rate_eps`, `batch_duration_ms`,
  `state_rows`, `state_memory_bytes`;
- node level: `cpu_util`, `mem_util`, `disk_util`, `net_util` (fractions 0..1), `cpu_idle`,
  `mem_idle`, `disk_idle`, `bw_idle`, and `q_score` (written by the controller's cycle).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from console.models import Job, MetricSample, Node
from console.policy.resources import NodeSample, idle_rates
from spark_runtime import keys as data_keys
from spark_runtime.progress import ProgressRecord
from workers import keys as control_keys

READ_BATCH = 2000


def _read_new(client, stream: str) -> list[tuple[str, dict]]:
    """Entries of `stream` after the stored cursor (at most READ_BATCH); advances nothing yet."""
    cursor = client.get(control_keys.ingest_cursor(stream)) or "0-0"
    return client.xrange(stream, min=f"({cursor}", count=READ_BATCH)


def _advance(client, stream: str, entries: list[tuple[str, dict]]) -> None:
    if entries:
        client.set(control_keys.ingest_cursor(stream), entries[-1][0])


def _at(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(float(epoch_s), tz=UTC)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def progress_samples(job: Job, record: ProgressRecord) -> list[MetricSample]:
    """MetricSample rows for one progress record of a primary replica (standbys are skipped:
    their output is held back, so their rates are not the job's)."""
    if not record.is_primary:
        return []
    at = _at(record.at)
    rows = []
    stage_metrics = {
        "throughput_eps": record.processed_rate,
        "input_rate_eps": record.input_rate,
        "batch_duration_ms": record.batch_ms,
        "state_rows": float(record.state_rows),
        "state_memory_bytes": float(record.state_memory_bytes),
    }
    for name, value in stage_metrics.items():
        if value is not None:
            rows.append(MetricSample(at=at, job=job, stage=record.stage, name=name, value=value))
    if record.final:
        job_metrics = {
            "throughput_eps": record.processed_rate,
            "input_rate_eps": record.input_rate,
            "batch_duration_ms": record.batch_ms,
            "latency_p50_ms": _ms(record.latency_p50),
            "latency_p90_ms": _ms(record.latency_p90),
            "latency_p99_ms": _ms(record.latency_p99),
        }
        for name, value in job_metrics.items():
            if value is not None:
                rows.append(MetricSample(at=at, job=job, stage="", name=name, value=value))
    return rows


def ingest_job_progress(client, job: Job) -> int:
    """Store the job's new progress records as MetricSample rows; return how many rows."""
    stream = data_keys.progress(job.key)
    entries = _read_new(client, stream)
    rows = [
        row
        for _, fields in entries
        for row in progress_samples(job, ProgressRecord.from_fields(fields))
    ]
    MetricSample.objects.bulk_create(rows, batch_size=500)
    _advance(client, stream, entries)
    return len(rows)


def node_sample_from_usage(name: str, usage: dict) -> NodeSample:
    """The policy's view of one agent sample."""
    return NodeSample(
        name=name,
        cpu_total=usage["cpu_total"],
        cpu_used=usage["cpu_used"],
        mem_total=usage["mem_total"],
        mem_used=usage["mem_used"],
        disk_throughput=usage["disk_throughput"],
        disk_max_throughput=usage["disk_max_throughput"],
        bw_used=usage["bw_used"],
        bw_total=usage["bw_total"],
    )


def usage_samples(node: Node, usage: dict) -> list[MetricSample]:
    """MetricSample rows for one agent sample: utilisation, idle rates and warm spares."""
    rates = idle_rates(node_sample_from_usage(node.name, usage))
    at = _at(usage["at"])
    values = {
        "cpu_util": 1 - rates.cpu,
        "mem_util": 1 - rates.mem,
        "disk_util": 1 - rates.disk,
        "net_util": 1 - rates.bw,
        "cpu_idle": rates.cpu,
        "mem_idle": rates.mem,
        "disk_idle": rates.disk,
        "bw_idle": rates.bw,
        # Idle warm spares the agent keeps (pre-started stage processes).
        "warm_spares": float(usage.get("spares", 0)),
    }
    return [MetricSample(at=at, node=node, name=k, value=round(v, 4)) for k, v in values.items()]


def ingest_node_metrics(client, node: Node) -> list[dict]:
    """Store a node's new usage samples; return them (newest last) for the policy cycle."""
    stream = control_keys.node_metrics(node.name)
    entries = _read_new(client, stream)
    usages = [json.loads(fields["sample"]) for _, fields in entries]
    rows = [row for usage in usages for row in usage_samples(node, usage)]
    MetricSample.objects.bulk_create(rows, batch_size=500)
    _advance(client, stream, entries)
    return usages


def recent_node_usages(client, node_name: str, count: int) -> list[dict]:
    """The node's newest `count` usage samples, newest first (the Q score's history)."""
    entries = client.xrevrange(control_keys.node_metrics(node_name), count=count)
    return [json.loads(fields["sample"]) for _, fields in entries]
