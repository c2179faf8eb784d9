"""Reading a job's final results from Redis (the data plane's sink writes them)."""

from __future__ import annotations

from console.models import Job
from spark_runtime import keys as data_keys
from workers.redis_client import redis_client


def read_results(job: Job, limit: int = 1000) -> dict:
    """The job's result hash (e.g. word -> count for wordcount), largest values first."""
    client = redis_client()
    try:
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
