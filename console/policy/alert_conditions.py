"""The conditions ops teams page on, decided from numbers alone (no Django, no Redis).

The controller's policy cycle (console.services.control.record.watch_conditions) gathers the
numbers, asks these functions which conditions hold, and raises or clears one alert per
condition (console.services.alert_routing). Each threshold is a policy field
(console.policy.config: bounds, and a new audited policy version for every change); 0 turns its
condition off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def unprotected_stages(
    unprotected_since: Mapping[str, float], protected: Iterable[str], now: float, limit_s: float
) -> dict[str, float]:
    """stage -> seconds without a standby, for the `protected` stages (those that should have
    one) that have run unprotected longer than `limit_s`."""
    if limit_s <= 0:
        return {}
    wanted = set(protected)
    return {
        stage: now - since
        for stage, since in unprotected_since.items()
        if stage in wanted and now - since > limit_s
    }


def output_stalled(
    last_output_at: float | None,
    last_input_at: float | None,
    watched_since: float,
    now: float,
    limit_s: float,
) -> bool:
    """No output for `limit_s` while input arrives: input came within the last `limit_s`, and
    the newest output (or, with none yet, the start of watching) is older than `limit_s`."""
    if limit_s <= 0 or last_input_at is None or now - last_input_at > limit_s:
        return False
    newest_output = last_output_at if last_output_at is not None else watched_since
    return now - newest_output > limit_s


def restarts_over(failure_times: Iterable[float], now: float, window_s: float, count: int) -> int:
    """The failures within the last `window_s` when they are `count` or more, else 0."""
    if count <= 0:
        return 0
    recent = sum(1 for at in failure_times if now - at <= window_s)
    return recent if recent >= count else 0


def slow_batches(batch_ms: Mapping[str, float], limit_s: float) -> dict[str, float]:
    """stage -> its newest batch's duration (s), for the stages whose batch (which commits the
    stage's checkpoint) took longer than `limit_s`."""
    if limit_s <= 0:
        return {}
    return {stage: ms / 1000.0 for stage, ms in batch_ms.items() if ms / 1000.0 > limit_s}


def checkpoint_failures(errors: Mapping[str, str]) -> dict[str, str]:
    """stage -> its replica's reported error, for errors that are about its checkpoint (the
    state store or the checkpoint location), as a stage reports them in its replica entry."""
    words = ("checkpoint", "statestore", "state store", "hdfsbackedstatestore", "commit log")
    return {
        stage: error for stage, error in errors.items() if any(w in error.lower() for w in words)
    }
