"""The host reserve in the controller: each job's policy cycle publishes its stages' standby
claims, reads every job's, and runs console.policy.reserve.plan_reserve on the hosts' measured
use; it carries out its own part (Algorithm 2 drops the downgraded standbys and adds the
restored ones, console/services/control/cycle.py) and keeps its claims' downgrade state in
Redis. Pure decisions live in console/policy/reserve.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from console.policy.reserve import (
    HostLoad,
    StandbyClaim,
    admit_launch,
    fresh_claims,
    host_loads,
    plan_reserve,
)
from console.services.control.observe import alive_nodes, node_history, parsed_entry
from console.services.planning import plan_job
from infra import keys as control_keys
from spark_runtime.topology import Topology

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReserveOutcome:
    """This job's part of the cycle's reserve plan, by operator (the top active operator of
    each stage): `vetoed` must run checkpoint-only (why), `restored` may have a standby again
    (why)."""

    vetoed: dict[str, str]
    restored: dict[str, str]


def hosts_of(beats: Mapping[str, dict]) -> dict[str, str]:
    """node -> the host its agent's heartbeat names ("" if none)."""
    return {name: str(beat.get("host", "")) for name, beat in beats.items()}


def machines_of(beats: Mapping[str, dict]) -> dict[str, tuple[float, float]]:
    """host -> (cores, MiB) of the machine, from the heartbeats that carry them (agents whose
    host is the machine they run on, infra.node_metrics.machine_totals)."""
    machines = {}
    for beat in beats.values():
        host, cpu, mem = beat.get("host"), beat.get("host_cpu"), beat.get("host_mem_mb")
        numbers = isinstance(cpu, int | float) and isinstance(mem, int | float)
        if host and numbers and cpu > 0 and mem > 0:
            machines[str(host)] = (float(cpu), float(mem))
    return machines


def current_loads(history: Mapping, beats: Mapping[str, dict]) -> dict[str, HostLoad]:
    """Each host's capacity and measured use from its alive agents' recent samples."""
    return host_loads(history, hosts_of(beats), machines=machines_of(beats))


def read_claims(client) -> list[StandbyClaim]:
    """Every job's published standby claims (malformed entries left out)."""
    claims = []
    for key, raw in client.hgetall(control_keys.reserve_claims()).items():
        entry = parsed_entry(raw, f"reserve claim {key}")
        if entry is not None:
            try:
                claims.append(StandbyClaim.from_dict(entry))
            except TypeError as exc:  # a field missing: written by another version
                log.warning("reserve claim %s is malformed, left out: %s", key, exc)
    return claims


def apply_reserve(
    client,
    job_key: str,
    wanted: Sequence[StandbyClaim],
    top_of: Mapping[str, str],
    beats: Mapping[str, dict],
    history: Mapping,
    reserve: float,
    now: float,
) -> ReserveOutcome:
    """Publish this job's claims (`wanted`: one per stage the policy gives a standby, keyed
    "job:stage"; their downgrade state is carried over from the published ones), plan the
    reserve over every fresh claim, and store this job's new downgrade state. `top_of`: claim
    key -> the operator Algorithm 2 knows the stage's standby by. Idempotent: the same
    measurements and claims give the same plan. Claims no cycle renewed within CLAIM_FRESH_S
    are deleted."""
    every = read_claims(client)
    published = {c.key: c for c in fresh_claims(every, now)}
    own = {}
    for claim in wanted:
        before = published.get(claim.key)
        if before is not None and before.downgraded_at is not None:
            claim = replace(claim, downgraded_at=before.downgraded_at, reason=before.reason)
        own[claim.key] = claim
    others = [c for key, c in published.items() if not key.startswith(f"{job_key}:")]
    plan = plan_reserve(
        current_loads(history, beats), hosts_of(beats), [*others, *own.values()], reserve, now
    )
    for key, reason in plan.downgrade.items():
        if key in own:
            own[key] = replace(own[key], node=None, downgraded_at=now, reason=reason)
    for key in plan.restore:
        if key in own:
            own[key] = replace(own[key], downgraded_at=None, reason="")
    # This job's stages that no longer claim a standby, and every job's claims no cycle renews
    # (the job ended): they no longer count against the reserve.
    stale = [key for key in published if key.startswith(f"{job_key}:") and key not in own]
    stale += [c.key for c in every if c.key not in published]
    with client.pipeline(transaction=False) as pipe:
        if stale:
            pipe.hdel(control_keys.reserve_claims(), *stale)
        if own:
            pipe.hset(
                control_keys.reserve_claims(),
                mapping={key: json.dumps(c.to_dict()) for key, c in own.items()},
            )
        pipe.execute()
    return ReserveOutcome(
        vetoed={top_of[key]: why for key, why in plan.vetoed().items() if key in own},
        restored={top_of[key]: why for key, why in plan.restore.items() if key in own},
    )


def launch_refusal(
    beats: Mapping[str, dict],
    history: Mapping,
    planned: Mapping[str, tuple[float, float]],
    reserve: float,
) -> str | None:
    """Why a launch whose primaries are `planned` (node -> (cpu, mem)) may not start now, or
    None: console.policy.reserve.admit_launch on the hosts' measured use."""
    return admit_launch(current_loads(history, beats), hosts_of(beats), planned, reserve)


def admission_refusal(client, topology: Topology, strategy: str, config) -> str | None:
    """Why a job of `topology` under `strategy` may not launch now (the reserve), or None: the
    launch's plan on the alive nodes, its primaries charged to their hosts' measured use. None
    too where no node is alive or the plan fails (the launch itself says why), and while the
    policy holds the reserve at placement only (hold_host_reserve 0)."""
    if not config.hold_host_reserve:
        return None
    beats = alive_nodes(client)
    history = node_history(client, beats)
    try:
        plan = plan_job(topology, strategy, history, config)
    except ValueError:
        return None
    return launch_refusal(beats, history, plan.primary_demands(), config.resource_reserve)
