"""The one way the data plane opens a Redis client (stages, sources, generators, benchmarks).

The console and the workers have their own factory (workers/redis_client.py), which reads the
URL from Django's settings; this one takes the URL it is given, so stage processes need no Django.
"""

from __future__ import annotations


def connect(url: str):
    """A client for `url` that returns str values (decode_responses), with redis-py's default
    socket timeouts. redis is imported here, not at the top, as the data plane's modules did
    before: importing this module (e.g. in a data source pickled to Spark's Python workers)
    does not import redis until a client is needed."""
    import redis

    return redis.Redis.from_url(url, decode_responses=True)
