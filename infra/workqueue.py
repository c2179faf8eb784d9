"""A delaying work queue of keys, as Kubernetes' controller-runtime feeds its reconcilers.

A key is in the queue at most once, due at the earliest time anyone asked for. A key handed to a
worker is not handed to another until that worker calls `done`; asked for meanwhile, it is
queued again when `done` is called, so one key is never reconciled by two workers at once and a
wake-up that arrives during a reconcile is not lost. No Django, no Redis: unit-tested alone.
"""

from __future__ import annotations

import heapq
import threading
import time

# An urgent key is queued as if it had been due this much earlier: before any backlog.
URGENT_AHEAD_S = 3600.0


class WorkQueue:
    """Keys due at a time; `get` blocks until one is due (or the queue is shut down)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Condition()
        self._heap: list[tuple[float, int, str]] = []
        self._due: dict[str, float] = {}  # queued key -> its due time (the heap may hold stale)
        self._processing: set[str] = set()
        self._again: dict[str, float] = {}  # asked for while processing -> due time
        self._dropped: set[str] = set()  # forgotten while processing: not queued again
        self._counter = 0
        self._shut = False

    def add(self, key: str, delay_s: float = 0.0, urgent: bool = False) -> None:
        """Queue `key` to be due in `delay_s` (now by default); an earlier request wins.
        `urgent`: ahead of every key that is merely due (a failure to answer goes before the
        periodic reconciles a busy controller is behind on)."""
        with self._lock:
            at = self._clock() + max(0.0, delay_s) - (URGENT_AHEAD_S if urgent else 0.0)
            self._dropped.discard(key)
            if key in self._processing:
                self._again[key] = min(at, self._again.get(key, at))
                return
            if key in self._due and self._due[key] <= at:
                return
            self._push(key, at)

    def _push(self, key: str, at: float) -> None:
        self._due[key] = at
        self._counter += 1
        heapq.heappush(self._heap, (at, self._counter, key))
        self._lock.notify()

    def get(self, timeout_s: float | None = None) -> str | None:
        """The next due key, marked as processing; None on shut-down or after `timeout_s`."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        with self._lock:
            while not self._shut:
                now = self._clock()
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded by an earlier request
                if self._heap and self._heap[0][0] <= now:
                    _, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    self._processing.add(key)
                    return key
                wait = self._heap[0][0] - now if self._heap else None
                if deadline is not None:
                    left = deadline - now
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._lock.wait(wait)
            return None

    def done(self, key: str, requeue_in_s: float | None = None) -> None:
        """A worker finished `key`: queue it again in `requeue_in_s` (None: only if it was asked
        for meanwhile), at the earlier of the two."""
        with self._lock:
            self._processing.discard(key)
            at = self._again.pop(key, None)
            if key in self._dropped:
                self._dropped.discard(key)
                return
            if requeue_in_s is not None:
                requeued = self._clock() + max(0.0, requeue_in_s)
                at = requeued if at is None else min(at, requeued)
            if at is not None and not (key in self._due and self._due[key] <= at):
                self._push(key, at)

    def forget(self, key: str) -> None:
        """Drop `key` (its lease was lost or released); a worker processing it finishes first."""
        with self._lock:
            self._due.pop(key, None)
            self._again.pop(key, None)
            if key in self._processing:
                self._dropped.add(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._due)

    def shut_down(self) -> None:
        """Wake every waiting `get` with None."""
        with self._lock:
            self._shut = True
            self._lock.notify_all()


# A key whose processing keeps failing is retried after this, doubling per failure in a row up
# to the cap (controller-runtime's per-item exponential failure rate limiter, 5 ms to 1000 s
# there; a job's reconcile costs more and a stuck one should be retried within a minute).
FAILURE_BASE_S = 1.0
FAILURE_CAP_S = 60.0


def failure_delay_s(
    failures: int, base_s: float = FAILURE_BASE_S, cap_s: float = FAILURE_CAP_S
) -> float:
    """How long to wait before trying a key again after its `failures`-th failure in a row:
    `base_s`, doubled for each further failure, at most `cap_s` (0 before any failure)."""
    if failures <= 0:
        return 0.0
    # The exponent is bounded so a key failing for days does not overflow the float.
    return min(cap_s, base_s * 2 ** min(failures - 1, 64))


class FailureBackoff:
    """Failures in a row per key and the delay they call for (`failure_delay_s`); a success
    forgets the key. Thread-safe: the reconcile threads share one."""

    def __init__(self, base_s: float = FAILURE_BASE_S, cap_s: float = FAILURE_CAP_S):
        self.base_s = base_s
        self.cap_s = cap_s
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()

    def failed(self, key: str) -> tuple[int, float]:
        """Count a failure of `key`: (failures in a row now, seconds to wait before the next
        try)."""
        with self._lock:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
        return failures, failure_delay_s(failures, self.base_s, self.cap_s)

    def succeeded(self, key: str) -> int:
        """Forget `key`'s failures; returns how many there were in a row."""
        with self._lock:
            return self._failures.pop(key, 0)

    def failures(self, key: str) -> int:
        """Failures of `key` in a row so far."""
        with self._lock:
            return self._failures.get(key, 0)

    def failing(self) -> int:
        """How many keys failed at their last try."""
        with self._lock:
            return len(self._failures)
