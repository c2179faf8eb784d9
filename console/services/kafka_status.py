"""A job's Kafka input as the console shows, exports and alerts on it (docs/KAFKA.md, "Lag and
causes on the console").

What the data plane writes (spark_runtime/kafka_source.py):

- `keys.kafka_lag(job)`: a hash replica id -> JSON {"stage", "topic", "at" (epoch s),
  "partitions": {"0": [read offset, end offset], ...}}, about every second, from every replica
  reading the job's Kafka input;
- in `keys.stats(job)`: `kafka:source`, the cause while the source cannot read (deleted once it
  reads again), `kafka:skipped`, offsets lost to retention and skipped (a source that accepts
  loss), and `dead:{stage}`, the records each stage dead-lettered.

Only the primaries' entries count: a standby reads the same input at its own pace (a caught-up
standby may be paced on purpose), and the entry of a replica that ended stays in the hash. The
lag of a partition is its end offset minus the offset read, never below 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from console.models import Job, Replica
from spark_runtime import external_io
from spark_runtime import keys as data_keys
from spark_runtime.kafka_source import SKIPPED, SOURCE_CAUSE

# Conditions the controller alerts on (console.services.control.record.watch_kafka).
SOURCE = "source"  # the source cannot read: the `kafka:source` cause is set
LAG = "lag"  # the primaries' total lag is over the policy's kafka_lag_alert_records
CONDITIONS = (SOURCE, LAG)
DEAD_PREFIX = "dead:"
ENDED_STATES = (Replica.State.STOPPED, Replica.State.FAILED)


def is_kafka(io) -> bool:
    """Whether a job's `source` or `sink` field names a Kafka topic."""
    return isinstance(io, dict) and io.get("kind") == external_io.KAFKA


def reads_kafka(job: Job) -> bool:
    return is_kafka(job.source)


def uses_kafka(job: Job) -> bool:
    return is_kafka(job.source) or is_kafka(job.sink)


def local_id(replica_id: str) -> str:
    """A stored replica id (`{job key}/{local id}`) as the data plane names it."""
    return replica_id.split("/", 1)[-1]


@dataclass(frozen=True)
class PartitionLag:
    partition: int
    read: int
    end: int

    @property
    def lag(self) -> int:
        """Records of the partition not read yet."""
        return max(0, self.end - self.read)


@dataclass(frozen=True)
class ReplicaLag:
    """One replica's newest lag entry: its stage, the topic, when it was written."""

    replica: str
    stage: str
    topic: str
    at: float
    partitions: tuple[PartitionLag, ...]

    @property
    def total(self) -> int:
        return sum(p.lag for p in self.partitions)


def parse_entry(replica: str, raw) -> ReplicaLag | None:
    """A lag entry as the data plane writes it, or None when it is not one."""
    try:
        entry = json.loads(raw)
        partitions = tuple(
            sorted(
                (PartitionLag(int(p), int(offsets[0]), int(offsets[1]))
                 for p, offsets in entry["partitions"].items()),
                key=lambda p: p.partition,
            )
        )  # fmt: skip
        return ReplicaLag(
            replica, str(entry.get("stage", "")), str(entry.get("topic", "")),
            float(entry.get("at", 0.0)), partitions,
        )  # fmt: skip
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        return None


def primary_lags(entries: Mapping[str, str], primaries: Iterable[str]) -> list[ReplicaLag]:
    """The lag entry of each stage's primary, by stage: `entries` is the hash as read,
    `primaries` the data-plane ids of the primaries. Where two replicas of a stage are
    primaries for a moment (a promotion, an upgrade's switch), the newest entry is the stage's."""
    wanted = set(primaries)
    newest: dict[str, ReplicaLag] = {}
    for replica, raw in sorted(entries.items()):
        lag = parse_entry(replica, raw) if replica in wanted else None
        if lag is not None and (lag.stage not in newest or lag.at > newest[lag.stage].at):
            newest[lag.stage] = lag
    return [newest[stage] for stage in sorted(newest)]


def total_lag(lags: list[ReplicaLag]) -> int | None:
    """Records the primaries are behind, all partitions together; None without any entry."""
    return sum(lag.total for lag in lags) if lags else None


def dead_letters(stats: Mapping[str, str]) -> dict[str, int]:
    """Stage -> records it dead-lettered, from the job's stats hash."""
    return {
        field.removeprefix(DEAD_PREFIX): int(value)
        for field, value in sorted(stats.items())
        if field.startswith(DEAD_PREFIX)
    }


def skipped_offsets(stats: Mapping[str, str]) -> int:
    return int(stats.get(SKIPPED) or 0)


def source_cause(stats: Mapping[str, str]) -> str:
    """Why the source cannot read now; "" while it reads."""
    return stats.get(SOURCE_CAUSE) or ""


def live_primaries(job_ids: Iterable[int]) -> dict[int, set[str]]:
    """Job id -> the data-plane ids of its live primaries (one query)."""
    found: dict[int, set[str]] = {}
    rows = (
        Replica.objects.filter(job_id__in=list(job_ids), role=Replica.Role.PRIMARY)
        .exclude(state__in=ENDED_STATES)
        .values_list("job_id", "replica_id")
    )
    for job_id, replica_id in rows:
        found.setdefault(job_id, set()).add(local_id(replica_id))
    return found


def kafka_jobs(jobs: Iterable[Job]) -> dict[int, str]:
    """Job id -> Redis key of the jobs of `jobs` that read Kafka."""
    return {job.pk: job.key for job in jobs if reads_kafka(job)}


def read_primary_lags(client, jobs: Mapping[int, str]) -> dict[int, list[ReplicaLag]]:
    """Job id -> its stages' primaries' lag entries, for `jobs` (id -> key: jobs that read
    Kafka): one query and one Redis round trip for all of them, none for no job."""
    if not jobs:
        return {}
    primaries = live_primaries(jobs)
    with client.pipeline(transaction=False) as pipe:
        for key in jobs.values():
            pipe.hgetall(data_keys.kafka_lag(key))
        entries = pipe.execute()
    return {
        job_id: primary_lags(raw, primaries.get(job_id, ()))
        for job_id, raw in zip(jobs, entries, strict=True)
    }


def read_source_causes(client, jobs: Mapping[int, str]) -> dict[int, str]:
    """Job id -> its source's current cause ("" while it reads), for `jobs` (id -> key: jobs
    that read Kafka), in one Redis round trip."""
    if not jobs:
        return {}
    with client.pipeline(transaction=False) as pipe:
        for key in jobs.values():
            pipe.hget(data_keys.stats(key), SOURCE_CAUSE)
        causes = pipe.execute()
    return {job_id: cause or "" for job_id, cause in zip(jobs, causes, strict=True)}


# --- alerts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaAlert:
    """A condition to alert on: `kind` (SOURCE or LAG), `since` (when the controller first saw
    it, epoch seconds as stored: the alert's identity) and what to say."""

    kind: str
    since: str
    detail: dict


def source_due_now(client, job: Job) -> list[KafkaAlert]:
    """A Kafka job's source that cannot read now, for the controller's looks between policy
    cycles: `since` is left empty, as the cycle's watch_kafka keeps when the condition began
    (and the lag, which counts only once over at two cycles, stays with it)."""
    if not reads_kafka(job):
        return []
    cause = source_cause(client.hgetall(data_keys.stats(job.key)))
    return [KafkaAlert(SOURCE, "", {"cause": cause})] if cause else []


def conditions_now(cause: str, total: int | None, limit: int) -> dict[str, dict]:
    """The conditions that hold now, each with what an alert says of it: the source's cause
    set, the total lag over `limit` (0: the lag alert is off)."""
    current = {}
    if cause:
        current[SOURCE] = {"cause": cause}
    if limit > 0 and total is not None and total > limit:
        current[LAG] = {"total": total, "limit": limit}
    return current


def track(
    seen: Mapping[str, str], current: Mapping[str, dict], now: float, not_before: float = 0.0
) -> tuple[dict[str, str], list[str], list[KafkaAlert]]:
    """One policy cycle's step of the conditions: (fields of keys.kafka_conditions to set,
    fields to delete, alerts due). `seen`: that hash as read (condition -> since); a since
    before `not_before` (the job's current run started) is from an earlier run and starts
    again. A source that cannot read is alerted at once; a lag over the bound once it was over
    it at the cycle before too (it stays above, not one burst)."""
    gone = [kind for kind in seen if kind not in current]
    seen = {
        kind: since
        for kind, since in seen.items()
        if kind in CONDITIONS and _epoch(since) is not None and _epoch(since) >= not_before
    }
    start = {kind: f"{now:.3f}" for kind in current if kind not in seen}
    due = []
    for kind, detail in current.items():
        if kind == SOURCE:
            due.append(KafkaAlert(SOURCE, seen.get(SOURCE) or start[SOURCE], dict(detail)))
        elif kind in seen:
            due.append(KafkaAlert(kind, seen[kind], dict(detail)))
    return start, gone, due


def _epoch(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
