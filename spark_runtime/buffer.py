"""The hot standby's bounded output buffer (pure Python, no Spark, no Redis).

A hot standby computes the same outputs as its primary but must not write them. It keeps them
here, per sink, ordered by version (input offset). After each batch it trims what the primary has
already written (versions below the primary's watermark for that sink). On promotion it hands
over everything left; the idempotent sinks then skip whatever the primary did write.

If the primary stalls, the buffer would grow without bound; past `max_records` the oldest records
are dropped and `lost_above` remembers the highest dropped version per sink. A promotion is only
safe if nothing above the primary's watermark was dropped (`gap`).
"""

from __future__ import annotations

from collections import deque


class OutputBuffer:
    """Per-sink FIFO of `(version, record)` pairs, bounded by `max_records` in total."""

    def __init__(self, max_records: int = 200_000):
        self.max_records = max_records
        self._sinks: dict[str, deque] = {}
        self._size = 0
        self.lost_above: dict[str, str] = {}

    def __len__(self) -> int:
        return self._size

    def add(self, sink: str, records: list) -> None:
        """Append records (objects with a `version` attribute) of one batch of one sink."""
        queue = self._sinks.setdefault(sink, deque())
        for rec in sorted(records, key=lambda r: r.version):
            queue.append(rec)
        self._size += len(records)
        while self._size > self.max_records:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        # Drop from the sink whose head is oldest, so the other sinks keep their tail.
        sink = min(
            (s for s, q in self._sinks.items() if q), key=lambda s: self._sinks[s][0].version
        )
        rec = self._sinks[sink].popleft()
        self._size -= 1
        if rec.version > self.lost_above.get(sink, ""):
            self.lost_above[sink] = rec.version

    def trim(self, sink: str, watermark: str) -> int:
        """Forget the records of `sink` below the primary's watermark; returns how many.

        Strictly below: records *at* the watermark may share their version with records the
        primary has not written yet (several keys updated by the same input), so they stay.
        """
        queue = self._sinks.get(sink)
        removed = 0
        while queue and queue[0].version < watermark:
            queue.popleft()
            removed += 1
        self._size -= removed
        return removed

    def records(self, sink: str) -> list:
        """The buffered records of `sink`, oldest first (a copy)."""
        return list(self._sinks.get(sink, ()))

    def discard(self, sink: str, written) -> int:
        """Forget the records of `sink` for which `written(record)` is true; returns how many."""
        queue = self._sinks.get(sink)
        if not queue:
            return 0
        kept = deque(r for r in queue if not written(r))
        removed = len(queue) - len(kept)
        self._sinks[sink] = kept
        self._size -= removed
        return removed

    def gap(self, sink: str, watermark: str) -> bool:
        """True if records the primary had not written were dropped (promotion would lose them)."""
        return sink in self.lost_above and self.lost_above[sink] >= watermark

    def sinks(self) -> list[str]:
        """The sinks with buffered records."""
        return [s for s, q in self._sinks.items() if q]

    def drain(self, sink: str) -> list:
        """Remove and return all buffered records of `sink`, oldest first."""
        queue = self._sinks.pop(sink, deque())
        self._size -= len(queue)
        return list(queue)
