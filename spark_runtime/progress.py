"""The progress record: what a stage publishes after each micro-batch, and how it is read back.

Every replica appends one record per micro-batch of each of its queries to the job's progress
stream (`keys.progress(job)`, capped at `keys.PROGRESS_MAXLEN`). A Redis stream entry holds
strings only, so `to_fields` encodes the record (None as "", booleans as "True"/"False", numbers
with `str`) and `from_fields` decodes it; both sides use this module, so the console, the
benchmarks and the stage agree on the fields and their types. `from_fields` accepts the records
older versions wrote: a missing, empty, "None" or "nan" value reads as None (or 0 for a count).

No Django imports: the stage processes import this module.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, fields
from typing import get_type_hints

from spark_runtime import keys

PRIMARY = "primary"


@dataclass(frozen=True)
class ProgressRecord:
    """One micro-batch of one query of one replica (see docs/DATA_PLANE.md, "Progress")."""

    replica: str
    stage: str
    role: str  # "primary" or "standby", when the batch ran
    node: str
    query: str  # the Spark query name
    segment: str  # the query's position in the stage ("0" reads the stage's input)
    batch: int  # Spark batch id
    at: float  # epoch seconds when the progress event arrived
    input_rows: int
    input_rate: float | None  # input rows per second (Spark's inputRowsPerSecond)
    processed_rate: float | None  # rows processed per second (processedRowsPerSecond)
    batch_ms: float | None  # batch duration
    state_rows: int  # rows in the state stores of the query's stateful operators
    state_memory_bytes: int
    rows_out: int  # rows the batch produced
    written: int  # records written to the sinks (0 for a standby, which buffers them)
    final: bool  # the batch's outputs are the job's results (not a channel to a next stage)
    buffered: int  # records held in the standby's output buffer after the batch
    # Event-time latency of the batch's output (seconds; None for non-final or empty batches).
    latency_p50: float | None = None
    latency_p90: float | None = None
    latency_p99: float | None = None
    # Spark's event-time watermark after the batch (ISO text; None for a query without one).
    watermark: str | None = None
    # JSON list of the batch's sources: {source, start, end, latest, lag} (source_summary).
    sources: str = ""

    @classmethod
    def of_batch(cls, progress, **fields) -> ProgressRecord:
        """The record of Spark's StreamingQueryProgress `progress`, received now: its batch,
        rates, duration and state sizes from Spark; who ran it and what it wrote (`fields`)
        from the caller."""
        ops = progress.stateOperators or []
        return cls(
            batch=progress.batchId,
            at=time.time(),
            input_rows=progress.numInputRows,
            input_rate=progress.inputRowsPerSecond,
            processed_rate=progress.processedRowsPerSecond,
            batch_ms=progress.batchDuration,
            state_rows=sum(op.numRowsTotal for op in ops),
            state_memory_bytes=sum(op.memoryUsedBytes for op in ops),
            watermark=(progress.eventTime or {}).get("watermark"),
            sources=source_summary(progress.sources or []),
            **fields,
        )

    def source_list(self) -> list[dict]:
        """The batch's sources as `source_summary` wrote them (empty for older records)."""
        try:
            decoded = json.loads(self.sources) if self.sources else []
        except ValueError:
            return []
        return decoded if isinstance(decoded, list) else []

    @property
    def is_primary(self) -> bool:
        """The batch ran on the stage's primary (a standby's rates and output are held back)."""
        return self.role == PRIMARY

    @property
    def is_output(self) -> bool:
        """The batch wrote results a consumer sees: a final stage's primary wrote something."""
        return self.is_primary and self.final and self.written > 0

    def to_fields(self) -> dict[str, str]:
        """The stream entry's fields (what goes into XADD)."""
        return {f.name: _encode(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_fields(cls, raw: dict) -> ProgressRecord:
        """Decode a stream entry's fields; tolerant of missing and empty values (older records)."""
        values = {}
        for f in fields(cls):
            text, kind = raw.get(f.name), _TYPES[f.name]
            if kind is str:
                values[f.name] = "" if text is None else str(text)
            elif kind == str | None:
                values[f.name] = str(text) if text not in (None, "", "None") else None
            elif kind is bool:
                values[f.name] = text == "True"
            elif kind in (int, float):
                # A count (or the time) that is missing reads as 0, not None.
                values[f.name] = kind(_number(text) or 0)
            else:
                values[f.name] = _number(text)
        return cls(**values)


# A source's description and offsets are cut to this many characters, and at most this many
# sources are kept: every batch of every query carries them in the capped progress stream.
SOURCE_TEXT_CHARS = 240
SOURCES_KEPT = 8


def offset_lag(end, latest) -> int | None:
    """How many offsets `end` (read up to) is behind `latest` (the source's newest): the sum
    over the offsets' numeric leaves (Kafka: topic -> partition -> offset; a file source: its
    log offset), None when the two are not comparable numbers (a Redis stream id, no latest)."""
    if isinstance(end, bool) or isinstance(latest, bool):
        return None
    if isinstance(end, int | float) and isinstance(latest, int | float):
        return max(0, int(latest) - int(end))
    if isinstance(end, dict) and isinstance(latest, dict) and end and set(end) == set(latest):
        parts = [offset_lag(end[key], latest[key]) for key in end]
        return None if any(part is None for part in parts) else sum(parts)
    return None


def _offset(value):
    """An offset as Spark's progress JSON holds it (text of JSON, or already decoded)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _cut(value) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:SOURCE_TEXT_CHARS]


def source_summary(sources) -> str:
    """The JSON the record keeps of Spark's SourceProgress list: each source's description and
    start, end and latest offsets (cut to SOURCE_TEXT_CHARS) and its lag (`offset_lag` of end
    against latest, else the source's own `maxOffsetsBehindLatest` metric, else None)."""
    summary = []
    for source in list(sources)[:SOURCES_KEPT]:
        end, latest = _offset(source.endOffset), _offset(source.latestOffset)
        lag = offset_lag(end, latest)
        behind = (source.metrics or {}).get("maxOffsetsBehindLatest")
        if lag is None and behind not in (None, ""):
            lag = int(float(behind))
        summary.append(
            {
                "source": _cut(source.description),
                "start": _cut(_offset(source.startOffset)),
                "end": _cut(end),
                "latest": _cut(latest),
                "lag": lag,
            }
        )
    return json.dumps(summary) if summary else ""


# The decoded type of each field (annotations are strings under `from __future__`).
_TYPES = get_type_hints(ProgressRecord)


def _encode(value) -> str:
    return "" if value is None else str(value)


def _number(text) -> float | None:
    """A float from a field's text; None for missing, empty, "None", "nan" and unparsable."""
    if text is None or text in ("", "None"):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def percentiles(values: list[float], points=(50, 90, 99)) -> dict[str, float | None]:
    """Nearest-rank percentiles of `values` as {"p50": ..., ...} (None when empty)."""
    if not values:
        return {f"p{p}": None for p in points}
    ordered = sorted(values)
    result = {}
    for p in points:
        rank = max(0, min(len(ordered) - 1, -(-p * len(ordered) // 100) - 1))
        result[f"p{p}"] = ordered[rank]
    return result


def publish_progress(client, job: str, record: ProgressRecord) -> None:
    """Append `record` to the job's progress stream (capped)."""
    client.xadd(
        keys.progress(job), record.to_fields(), maxlen=keys.PROGRESS_MAXLEN, approximate=True
    )


def read_progress(
    client,
    job: str,
    start_s: float | None = None,
    end_s: float | None = None,
    count: int | None = None,
) -> list[ProgressRecord]:
    """The job's progress records published in [start_s, end_s] (epoch seconds; open-ended when
    None), oldest first, at most `count`. Stream ids are the publish time in milliseconds."""
    low = "-" if start_s is None else f"{int(start_s * 1000)}-0"
    high = "+" if end_s is None else str(int(end_s * 1000))
    entries = client.xrange(keys.progress(job), min=low, max=high, count=count)
    return [ProgressRecord.from_fields(raw) for _, raw in entries]
