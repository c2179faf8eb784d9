"""Data every viewer shares: computed once per freshness interval, whoever asks.

During an incident many people watch the same job; each browser refreshes every 2 seconds, and
without sharing each refresh would run the same queries and build the same figures again. Here
the first request after the data went stale computes it and puts it in the cache (Redis, shared
by every web worker process); requests that arrive while it computes wait for that result instead
of computing their own; the rest read it. So a page's data is at most its refresh interval old,
and 50 viewers cost about what one does.

Entries carry the time their computation started (`Shared.computed_at`), which pages show as the
data's age. Any write through the console or the API (`invalidate_all`) starts a new generation
of entries, so an operator who stops a job sees it stopped on the next refresh, not one interval
later.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache

GENERATION_KEY = "shared-data:generation"
# How long a request waits for another one's computation before computing on its own; a page's
# heaviest refresh takes well under a second.
WAIT_S = 5.0
POLL_S = 0.02
# A computing request that died leaves its mark for at most this long.
COMPUTING_MARK_S = 30


@dataclass(frozen=True)
class Shared:
    """A shared value and when its computation started (seconds since the epoch)."""

    value: Any
    computed_at: float
    # True when this request computed the value, False when it read another request's result.
    computed_here: bool


def entry_key(namespace: str, parts) -> str:
    """A cache key for `parts` (anything JSON can encode) under `namespace`, of bounded length."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return f"shared-data:{namespace}:{digest[:32]}"


def invalidate_all() -> None:
    """Make every shared entry stale (after a write that pages and the API must show at once)."""
    try:
        cache.incr(GENERATION_KEY)
    except ValueError:  # no generation yet
        cache.add(GENERATION_KEY, 1, timeout=None)


def _fresh(entry, fresh_s: float) -> bool:
    return entry is not None and time.time() - entry[0] < fresh_s


def shared(
    key: str,
    fresh_s: float,
    compute: Callable[[], Any],
    keep: Callable[[Any], bool] = lambda value: True,
) -> Shared:
    """The value of `compute()` under `key`, computed at most once per `fresh_s` seconds.

    `keep(value)` says whether a computed value may be shared (an error response is not): when it
    says no, the value goes to this request only and the next one computes again.
    """
    generation = cache.get(GENERATION_KEY, 0)
    versioned = f"{key}:{generation}"
    entry = cache.get(versioned)
    if _fresh(entry, fresh_s):
        return Shared(entry[1], entry[0], computed_here=False)
    computing = f"{versioned}:computing"
    owns_mark = cache.add(computing, 1, timeout=COMPUTING_MARK_S)
    if not owns_mark:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
            entry = cache.get(versioned)
            if _fresh(entry, fresh_s):
                return Shared(entry[1], entry[0], computed_here=False)
            if cache.get(computing) is None:
                break  # the other request finished without a value to share, or died
        # Waited long enough: compute for this request (and share it, if it is still missing).
    started = time.time()
    try:
        value = compute()
        if keep(value):
            # Kept a few intervals so a request arriving just after expiry still finds the key
            # (and its age tells it to compute again).
            cache.set(versioned, (started, value), timeout=max(1, math.ceil(fresh_s * 3)))
    finally:
        if owns_mark:
            cache.delete(computing)
    return Shared(value, started, computed_here=True)
