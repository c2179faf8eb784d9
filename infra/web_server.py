"""How many gunicorn workers and threads the console runs with (read by web/gunicorn.conf.py and
printed by the demo), from the environment or the machine."""

from __future__ import annotations

import os

from spark_runtime.env import env


def _positive_int(name: str, default: int) -> int:
    """`name` as a whole number of at least 1 (spark_runtime.env: a bad value stops the
    process, naming the variable), `default` when unset or empty."""
    value = env(name, "", lambda raw: at_least_one(raw) if raw.strip() else "")
    return default if value == "" else value


def at_least_one(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(f"must be at least 1, got {value}")
    return value


def worker_count() -> int:
    """WEB_CONCURRENCY, else one more than the CPU count, at most 8.

    The console's requests are CPU-bound Python (Django, Dash, plotly's JSON), so processes, not
    threads, add throughput; one more than the cores keeps each core busy while a worker waits
    on PostgreSQL or Redis.
    """
    return _positive_int("WEB_CONCURRENCY", min((os.cpu_count() or 1) + 1, 8))


def thread_count() -> int:
    """GUNICORN_THREADS, else 4: a worker waiting on the database or a page's shared data keeps
    serving the kept-alive connections of other viewers."""
    return _positive_int("GUNICORN_THREADS", 4)


def timeout_s() -> int:
    """GUNICORN_TIMEOUT, else 30: a worker silent this long is killed and replaced."""
    return _positive_int("GUNICORN_TIMEOUT", 30)
