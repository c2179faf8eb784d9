"""The serializer of the console's Django cache: JSON, never pickle.

Django's RedisCache pickles every value but integers. The cache lives in the Redis that the
stage processes, which run users' code, are given the URL of: a pickle written there by a job
would run the job's code in the console when read. JSON only carries data. Integers stay plain
Redis integers, as with Django's serializer, so `incr` stays atomic.
"""

from __future__ import annotations

import json
from typing import Any


class JSONSerializer:
    """`dumps` and `loads` as django.core.cache.backends.redis.RedisSerializer has them, with
    JSON for everything but integers (a tuple comes back as a list)."""

    def dumps(self, obj: Any) -> int | bytes:
        """An integer as itself (Redis INCR works on it), anything else as JSON."""
        # type() rather than isinstance(): True is not stored as the integer 1.
        if type(obj) is int:
            return obj
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        """The value `dumps` stored."""
        try:
            return int(data)
        except ValueError:
            return json.loads(data)
