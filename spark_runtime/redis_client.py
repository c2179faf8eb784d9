"""The one way the data plane opens a Redis client (stages, sources, generators, benchmarks).

The console and the workers have their own factory (infra/redis_client.py), which reads the
URL from Django's settings; this one takes the URL it is given, so stage processes need no Django.
"""

from __future__ import annotations

# A Redis restart (with persistence, docs/RELIABILITY.md) takes a few seconds. Data-plane clients
# retry a command that failed on the connection for about this long before they give up, so a
# restart does not fail every query at once. Retrying is safe for what the data plane writes:
# the sinks' writes are fenced and versioned, dead-letters are gated by HSETNX, heartbeats and
# replica entries are overwritten. The generator's XADDs are not: it uses ride_out_outages=False
# and resynchronises with the stream itself (spark_runtime/generators.py).
OUTAGE_RETRIES = 25  # with the backoff below: about 23 s
OUTAGE_BACKOFF_BASE_S = 0.1
OUTAGE_BACKOFF_CAP_S = 1.0
CONNECT_TIMEOUT_S = 2.0


def connect(url: str, *, ride_out_outages: bool = True):
    """A client for `url` that returns str values (decode_responses).

    ride_out_outages: retry a command that failed on the connection (refused, reset, timed out)
    for about 23 s, reconnecting each time; False: redis-py's default (three quick retries).
    redis is imported here, not at the top, as the data plane's modules did before: importing
    this module (e.g. in a data source pickled to Spark's Python workers) does not import redis
    until a client is needed."""
    import redis
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    if not ride_out_outages:
        return redis.Redis.from_url(url, decode_responses=True)
    retry = Retry(
        ExponentialBackoff(cap=OUTAGE_BACKOFF_CAP_S, base=OUTAGE_BACKOFF_BASE_S), OUTAGE_RETRIES
    )
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        retry=retry,
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
        socket_connect_timeout=CONNECT_TIMEOUT_S,
    )
