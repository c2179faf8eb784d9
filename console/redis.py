"""The Redis client of code running under Django: infra.redis_client at settings.REDIS_URL.

settings.REDIS_URL is read at each call, so a test that points it elsewhere is followed.
"""

from __future__ import annotations

import redis
from django.conf import settings

from infra.redis_client import redis_client as open_client


def redis_client(
    url: str | None = None, *, decode_responses: bool = True, timeout: float | None = None
) -> redis.Redis:
    """A client for `url` (default settings.REDIS_URL); options as infra.redis_client."""
    return open_client(
        url or settings.REDIS_URL, decode_responses=decode_responses, timeout=timeout
    )
