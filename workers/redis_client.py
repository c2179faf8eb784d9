"""The one way the console, the Celery workers and the node agents open a Redis client.

The URL comes from Django's settings (REDIS_URL) unless one is given. The data plane, which must
not import Django, has its own factory (spark_runtime/redis_client.py). Keys come from
workers/keys.py (control plane) and spark_runtime/keys.py (data plane), never from literals.
"""

from __future__ import annotations

import redis
from django.conf import settings


def redis_client(
    url: str | None = None, *, decode_responses: bool = True, timeout: float | None = None
) -> redis.Redis:
    """A client for `url` (default settings.REDIS_URL).

    decode_responses: str values (True) or bytes. timeout: connect and socket timeout in seconds
    for a quick reachability check; None keeps redis-py's defaults (5 s each in redis-py 8).
    """
    options = {"decode_responses": decode_responses}
    if timeout is not None:
        options.update(socket_connect_timeout=timeout, socket_timeout=timeout)
    return redis.Redis.from_url(url or settings.REDIS_URL, **options)
