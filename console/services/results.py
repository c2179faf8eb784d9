"""Reading a job's final results from Redis (the data plane's sink writes them)."""

from __future__ import annotations

from console.models import Job
from console.redis import redis_client
from spark_runtime import keys as data_keys
from spark_runtime.jobdef import JobDefinition, resolve_topology
from spark_runtime.topology import OUT_CHANNEL


def read_results(job: Job, limit: int = 1000) -> dict:
    """The job's result hash (e.g. word -> count for wordcount), largest values first; for a user
    job that appends its results (docs/JOBS.md), the newest records of its output stream."""
    client = redis_client()
    try:
        user_job = resolve_topology(job.topology).job
        # An existing app (spark_runtime/apps.py) writes where its code says: its results hash
        # stays empty.
        if isinstance(user_job, JobDefinition) and user_job.final_channel == OUT_CHANNEL:
            stream = data_keys.output_stream(job.key)
            newest = client.xrevrange(stream, count=limit)
            return {
                "key": stream,
                "total_records": client.xlen(stream),
                "records": [{"entry": entry_id, **fields} for entry_id, fields in newest],
            }
        raw = client.hgetall(data_keys.results(job.key))
    finally:
        client.close()
    items = sorted(raw.items(), key=lambda kv: (-_as_number(kv[1]), kv[0]))
    return {
        "key": data_keys.results(job.key),
        "total_keys": len(raw),
        "results": dict(items[:limit]),
    }


def _as_number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0
