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
later. A read is one round trip (the generation and the entry in one MGET); the keys are in
infra/keys.py. Values are pickled: only this module writes them, into the console's own Redis.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from console.redis import redis_client
from infra import keys

# How long a request waits for another one's computation before computing on its own; a page's
# heaviest refresh takes well under a second.
WAIT_S = 5.0
POLL_S = 0.02
# A computing request that died leaves its mark for at most this long.
COMPUTING_MARK_S = 30

_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def _redis() -> redis.Redis:
    """One client (and connection pool) per process and URL: a cache read is then one round
    trip on a kept connection, not a new client object per call."""
    url = settings.REDIS_URL
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis_client(url, decode_responses=False)
        return client


@dataclass(frozen=True)
class Shared:
    """A shared value and when its computation started (seconds since the epoch)."""

    value: Any
    computed_at: float
    # True when this request computed the value, False when it read another request's result.
    computed_here: bool


@dataclass(frozen=True)
class EntryKey:
    """Where one piece of shared data lives: a namespace and a digest of its inputs."""

    namespace: str
    digest: str


def entry_key(namespace: str, parts) -> EntryKey:
    """The key of `parts` (anything JSON can encode) under `namespace`, of bounded length."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    return EntryKey(namespace, digest[:32])


def invalidate_all() -> None:
    """Make every shared entry stale (after a write that pages and the API must show at once)."""
    _redis().incr(keys.shared_data_generation())


def _read(key: EntryKey, fresh_s: float) -> tuple[int, tuple | None]:
    """The current generation and the entry when it is of that generation and fresh."""
    generation, raw = _redis().mget(
        keys.shared_data_generation(), keys.shared_data(key.namespace, key.digest)
    )
    generation = int(generation or 0)
    if raw is None:
        return generation, None
    entry_generation, computed_at, value = pickle.loads(raw)
    if entry_generation != generation or time.time() - computed_at >= fresh_s:
        return generation, None
    return generation, (computed_at, value)


def shared(
    key: EntryKey,
    fresh_s: float,
    compute: Callable[[], Any],
    keep: Callable[[Any], bool] = lambda value: True,
) -> Shared:
    """The value of `compute()` under `key`, computed at most once per `fresh_s` seconds.

    `keep(value)` says whether a computed value may be shared (an error response is not): when it
    says no, the value goes to this request only and the next one computes again.
    """
    client = _redis()
    generation, entry = _read(key, fresh_s)
    if entry is not None:
        return Shared(entry[1], entry[0], computed_here=False)
    computing = keys.shared_data_computing(key.namespace, key.digest)
    owns_mark = bool(client.set(computing, b"1", nx=True, ex=COMPUTING_MARK_S))
    if not owns_mark:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
            generation, entry = _read(key, fresh_s)
            if entry is not None:
                return Shared(entry[1], entry[0], computed_here=False)
            if not client.exists(computing):
                break  # the other request finished without a value to share, or died
        # Waited long enough: compute for this request (and share it, if it is still missing).
    started = time.time()
    try:
        value = compute()
        if keep(value):
            # Kept a few intervals so a request arriving just after expiry still finds the key
            # (and its age tells it to compute again).
            client.set(
                keys.shared_data(key.namespace, key.digest),
                pickle.dumps((generation, started, value), protocol=pickle.HIGHEST_PROTOCOL),
                ex=max(1, math.ceil(fresh_s * 3)),
            )
    finally:
        if owns_mark:
            client.delete(computing)
    return Shared(value, started, computed_here=True)
