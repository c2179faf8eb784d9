"""Request rates of the API: per user once authenticated, per client address before.

DRF's throttles with two changes:

- the rates are read from the settings (API_THROTTLE_RATES, from API_THROTTLE_USER and
  API_THROTTLE_ANON) on each request, not copied when DRF is imported;
- a fixed window counted by one atomic INCR in the shared cache, instead of DRF's list of every
  request's time, which each request reads and writes whole (6000 timestamps at 6000/min) and
  which two web workers can overwrite at once, each counting one request too few.

A refused request answers 429 with a Retry-After header and the JSON error of every API error
(console.api.exceptions): {"error": {"status": 429, "code": "throttled", "detail": ...}}.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework import throttling


class FixedWindowThrottle(throttling.SimpleRateThrottle):
    """At most `num_requests` per window of `duration` seconds (the rate of `scope` in
    API_THROTTLE_RATES; None: no limit) for each cache key."""

    def get_rate(self) -> str | None:
        return settings.API_THROTTLE_RATES.get(self.scope)

    def get_ident(self, request) -> str:
        # REMOTE_ADDR, which console.middleware.TrustedProxyMiddleware has set to the client's
        # address; DRF's own reading believes any X-Forwarded-For, which a client can make up.
        return request.META.get("REMOTE_ADDR", "")

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        now = self.timer()
        window = int(now // self.duration)
        key = f"{self.key}:{window}"
        # The counter outlives its window by a second so a late INCR never recreates it.
        self.cache.add(key, 0, timeout=self.duration + 1)
        try:
            count = self.cache.incr(key)
        except ValueError:  # expired between the two calls: this request opens it again
            self.cache.add(key, 1, timeout=self.duration + 1)
            count = 1
        self.retry_after_s = (window + 1) * self.duration - now
        return count <= self.num_requests

    def wait(self) -> float:
        return self.retry_after_s


class UserThrottle(FixedWindowThrottle, throttling.UserRateThrottle):
    """Authenticated requests, per user (anonymous ones per address under the same scope)."""


class AnonThrottle(FixedWindowThrottle, throttling.AnonRateThrottle):
    """Anonymous requests, per client address (authenticated ones are not counted here)."""
