"""Stray replicas: processes that run, beating their heartbeat, while the job's supervision
state no longer lists them. A kill that was lost leaves one (its agent down when the kill was
sent, the message expired), as does a replica started under a state the controller lost
before saving. The controller's cycle reconciles what runs against what should: it kills a
stray, fenced like every command. Pure, no Django imports.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def stray_candidates(
    reported: Mapping[str, dict], alive: Mapping[str, bool], known: Collection[str]
) -> dict[str, dict]:
    """Replica id -> its entry, of the replicas whose heartbeat is alive (`alive`: from the
    heartbeat keys, which expire) but which the supervision state (`known`) does not list."""
    return {
        replica_id: entry
        for replica_id, entry in reported.items()
        if alive.get(replica_id) and replica_id not in known
    }


def confirmed_strays(beats: Mapping[str, float], before: Mapping[str, float]) -> list[str]:
    """The candidates (replica id -> heartbeat time now) that were candidates at the previous
    cycle too (`before`) and whose heartbeat moved on since: a process still running, not an
    entry left by one that was just killed (its heartbeat key outlives it by a few seconds)."""
    return sorted(
        replica_id
        for replica_id, beat in beats.items()
        if replica_id in before and beat > before[replica_id]
    )
