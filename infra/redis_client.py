"""How the control plane (console, Celery workers, node agents, launcher) opens a Redis client.

No Django here: the caller names the URL. Code running under Django uses
console.redis.redis_client(), which passes settings.REDIS_URL. The data plane has its own
factory (spark_runtime/redis_client.py), which retries through a Redis restart. Keys come from
infra/keys.py (control plane) and spark_runtime/keys.py (data plane), never from literals.
"""

from __future__ import annotations

import redis


def redis_client(
    url: str, *, decode_responses: bool = True, timeout: float | None = None
) -> redis.Redis:
    """A client for `url`.

    decode_responses: str values (True) or bytes. timeout: connect and socket timeout in seconds
    for a quick reachability check; None keeps redis-py's defaults (5 s each in redis-py 8).
    """
    options = {"decode_responses": decode_responses}
    if timeout is not None:
        options.update(socket_connect_timeout=timeout, socket_timeout=timeout)
    return redis.Redis.from_url(url, **options)
