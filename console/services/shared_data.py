"""Data every viewer shares: computed once per freshness interval, whoever asks.

During an incident many people watch the same job; each browser refreshes every 2 seconds, and
without sharing each refresh would run the same queries and build the same figures again. Here
the first request after the data went stale computes it and puts it in Redis (shared by every
web worker process); requests that arrive while it computes get the previous value (or, for the
very first one, wait for the result) instead of computing their own; the rest read it. So a
page's data is its refresh interval old, plus one computation while a new one runs, and 50
viewers cost about what one does.

Entries carry the time their computation started (`Shared.computed_at`), which pages show as the
data's age. Any write through the console or the API (`invalidate_all`) starts a new generation
of entries, so an operator who stops a job sees it stopped on the next refresh, not one interval
later. A read is one round trip (the generation and the entry in one MGET); the keys are in
infra/keys.py. Entries are JSON, never pickles: the stage processes, which run users' code, reach
the same Redis, and unpickling what they could write there would run their code in the console.
A value must therefore be made of JSON types (a tuple comes back as a list).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

from console.redis import redis_client
from infra import keys

# How long a request with nothing to show waits for another one's computation before computing
# on its own (a page's heaviest refresh takes about a second on a loaded 2-core machine).
WAIT_S = 10.0
# How long an entry stays readable after its computation: the stale value others get while the
# next one is computed, and the page's age tells them how old it is.
STALE_KEPT_S = 60
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
    """A shared value and when its computation started (seconds since the epoch): the time the
    data it shows was read."""

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


def _read(key: EntryKey) -> tuple[int, tuple | None]:
    """The current generation and the entry (computed_at, value, stored_at) when it is of that
    generation, however old."""
    generation, raw = _redis().mget(
        keys.shared_data_generation(), keys.shared_data(key.namespace, key.digest)
    )
    generation = int(generation or 0)
    if raw is None:
        return generation, None
    try:
        entry_generation, computed_at, value, stored_at = json.loads(raw)
    except (ValueError, TypeError):
        # Not an entry this module wrote (a pickle of an older version, or a forgery): recompute.
        return generation, None
    if entry_generation != generation:
        return generation, None
    return generation, (computed_at, value, stored_at)


def _fresh(entry, fresh_s: float) -> bool:
    # Counted from when the value was stored, so a computation slower than the interval (a loaded
    # machine) is not followed at once by the next one.
    return entry is not None and time.time() - entry[2] < fresh_s


def shared(
    key: EntryKey,
    fresh_s: float,
    compute: Callable[[], Any],
    keep: Callable[[Any], bool] = lambda value: True,
) -> Shared:
    """The value of `compute()` under `key`, computed at most once per `fresh_s` seconds (counted
    from the end of the last computation).

    While one request computes a new value, the others get the previous one (its age says how
    old), or, when there is none yet, wait for it: a slow computation on a loaded machine never
    makes every waiting viewer compute too. `keep(value)` says whether a computed value may be
    shared (an error response is not): when it says no, the value goes to this request only and
    the next one computes again.
    """
    client = _redis()
    generation, entry = _read(key)
    if _fresh(entry, fresh_s):
        return Shared(entry[1], entry[0], computed_here=False)
    computing = keys.shared_data_computing(key.namespace, key.digest)
    owns_mark = bool(client.set(computing, b"1", nx=True, ex=COMPUTING_MARK_S))
    if not owns_mark:
        if entry is not None:
            return Shared(entry[1], entry[0], computed_here=False)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            time.sleep(POLL_S)
            generation, entry = _read(key)
            if entry is not None:
                return Shared(entry[1], entry[0], computed_here=False)
            if not client.exists(computing):
                break  # the other request finished without a value to share, or died
        # Nothing to share after waiting: compute for this request (and share it if possible).
        owns_mark = bool(client.set(computing, b"1", nx=True, ex=COMPUTING_MARK_S))
    # Another request may have stored a value and dropped its mark between our first read and
    # our mark (a thread delayed that long on a loaded machine): read again before computing.
    generation, fresher = _read(key)
    if _fresh(fresher, fresh_s):
        if owns_mark:
            client.delete(computing)
        return Shared(fresher[1], fresher[0], computed_here=False)
    started = time.time()
    try:
        value = compute()
        if keep(value):
            # Kept a while after it goes stale: while the next value is computed, the other
            # viewers get this one instead of waiting.
            client.set(
                keys.shared_data(key.namespace, key.digest),
                json.dumps([generation, started, value, time.time()], separators=(",", ":")),
                ex=max(STALE_KEPT_S, math.ceil(fresh_s * 3)),
            )
    finally:
        if owns_mark:
            client.delete(computing)
    return Shared(value, started, computed_here=True)
