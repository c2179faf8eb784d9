"""Reading a job's final results from Redis (the data plane's sink writes them)."""

from __future__ import annotations

import redis
from django.conf import settings

from console.models import Job


def results_key(job: Job) -> str:
    return f"backstop:{job.key}:results"


def read_results(job: Job, limit: int = 1000) -> dict:
    """The job's result hash (e.g. word -> count for wordcount), largest values first."""
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    try:
        raw = client.hgetall(results_key(job))
    finally:
        client.close()
    items = sorted(raw.items(), key=lambda kv: (-_as_number(kv[1]), kv[0]))
    return {
        "key": results_key(job),
        "total_keys": len(raw),
        "results": dict(items[:limit]),
    }


def _as_number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0
