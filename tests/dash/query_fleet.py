"""A fleet for counting queries: jobs with operators, replicas, faults, recovery episodes,
controller decisions (failures paired with responses) and metric samples, built with real model
rows so every table of the console and every list of the API has rows to show.

`build_fleet` adds to what is there (give each call its own `prefix`), so a test counts the
queries of a page on a small fleet, grows it, and counts again. What it made comes back in
`Built`, from which tests compute the rows they expect, never from the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.utils import timezone

from console.dash.data import JOB_METRICS, NODE_ROW_METRICS, OPERATOR_METRICS
from console.models import (
    ControlDecision,
    FaultInjection,
    Job,
    MetricSample,
    Node,
    RecoveryEpisode,
    Replica,
)
from tests.factories import make_job

STRATEGIES = ("adaptive", "restart-all", "local-restart", "active-all")
OPERATORS = ("source", "split", "count", "sink")  # the wordcount topology


@dataclass
class Built:
    """What one build_fleet call made."""

    jobs: list[Job] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    # Per job id: its live replicas, every replica, faults, episodes, decisions and failures.
    live_replicas: dict[int, int] = field(default_factory=dict)
    replicas: dict[int, int] = field(default_factory=dict)
    standbys: dict[int, int] = field(default_factory=dict)
    faults: dict[int, int] = field(default_factory=dict)
    episodes: dict[int, int] = field(default_factory=dict)
    open_episodes: dict[int, int] = field(default_factory=dict)
    decisions: dict[int, int] = field(default_factory=dict)
    failures: dict[int, int] = field(default_factory=dict)


def build_fleet(
    jobs: int,
    nodes: int,
    *,
    prefix: str,
    per_job: int,
    samples: int,
    user=None,
    now: datetime | None = None,
) -> Built:
    """`jobs` running wordcount jobs on `nodes` new nodes. Each job gets a primary for split and
    count, a standby for count (with the policy's verdict) and one stopped replica; `per_job`
    faults (node and operator faults, asked by `user` or a schedule), as many recovery episodes
    (the first one still open when `per_job` > 1), `per_job` failures each answered by the
    controller (by replica, or by stage when the failure names no replica) plus `per_job`
    interval changes; and `samples` points of job, operator and node metrics within the last
    few minutes. Everything happened within the last 15 minutes."""
    now = now or timezone.now()
    built = Built()
    built.nodes = [
        Node.objects.create(
            name=f"{prefix}node-{index}",
            cpu_total=8.0,
            mem_total_mb=16384.0,
            state=Node.State.DOWN if index == nodes - 1 and nodes > 2 else Node.State.UP,
            last_heartbeat=now,
        )
        for index in range(nodes)
    ]
    replicas, faults, decisions, samples_rows = [], [], [], []
    for index in range(jobs):
        job = make_job(
            Job.Status.RUNNING,
            name=f"{prefix}job-{index:02d}",
            strategy=STRATEGIES[index % len(STRATEGIES)],
        )
        built.jobs.append(job)
        node_at = [built.nodes[(index + k) % nodes] for k in range(4)]
        placed = [
            ("split", Replica.Role.PRIMARY, Replica.State.RUNNING, node_at[0], {}),
            ("count", Replica.Role.PRIMARY, Replica.State.RUNNING, node_at[1], {}),
            ("count", Replica.Role.STANDBY, Replica.State.RUNNING, node_at[2],
             {"rule": "kept", "reason": f"{node_at[2].name} has the highest Q",
              "reserve": "kept: cpu 40% free", "at": now.isoformat()}),
            ("split", Replica.Role.PRIMARY, Replica.State.STOPPED, node_at[3], {}),
        ]  # fmt: skip
        for number, (stage, role, state, node, verdict) in enumerate(placed):
            replicas.append(
                Replica(
                    job=job,
                    replica_id=f"{job.key}-{stage}-{number}",
                    stage=stage,
                    node=node,
                    role=role,
                    state=state,
                    pid=1000 + number,
                    last_heartbeat=now,
                    nice=5 if role == Replica.Role.STANDBY else -5,
                    placement=verdict,
                )
            )
        built.replicas[job.pk] = len(placed)
        built.live_replicas[job.pk] = sum(1 for p in placed if p[2] == Replica.State.RUNNING)
        built.standbys[job.pk] = sum(1 for p in placed if p[1] == Replica.Role.STANDBY)
        for k in range(per_job):
            node_fault = k % 2 == 1
            faults.append(
                FaultInjection(
                    job=job,
                    kind=FaultInjection.Kind.STRESS_NODE if node_fault else "kill-driver",
                    target_operator="" if node_fault else "count",
                    target_node=node_at[1] if node_fault else None,
                    requested_by=user if k % 3 == 0 else None,
                    outcome=FaultInjection.Outcome.INJECTED,
                    injected_at=now - timedelta(seconds=30 * (k + 1) + 1),
                )
            )
            at = now - timedelta(seconds=30 * (k + 1))
            replica_id = f"{job.key}-count-1" if k % 2 == 0 else ""
            decisions += [
                ControlDecision(job=job, at=at, kind="failure", stage="count", operator="count",
                                node=node_at[1].name, replica_id=replica_id,
                                reason=f"failure {k}", detail={"error_tail": f"Killed {k}"}),
                ControlDecision(job=job, at=at, kind="promote", stage="count", operator="count",
                                node=node_at[2].name, replica_id=replica_id,
                                reason=f"answer {k}"),
                ControlDecision(job=job, at=at - timedelta(seconds=5), kind="set-interval",
                                stage="split", operator="split", reason=f"interval {k}"),
            ]  # fmt: skip
        built.faults[job.pk] = per_job
        built.decisions[job.pk] = 3 * per_job
        built.failures[job.pk] = per_job
        for i in range(samples):
            at = now - timedelta(seconds=10 * i)
            for name in JOB_METRICS:
                samples_rows.append(MetricSample(at=at, job=job, stage="", name=name, value=100.0))
            for op in OPERATORS:
                for name in OPERATOR_METRICS:
                    samples_rows.append(
                        MetricSample(at=at, job=job, stage=op, name=name, value=0.5)
                    )
    Replica.objects.bulk_create(replicas)
    FaultInjection.objects.bulk_create(faults)
    ControlDecision.objects.bulk_create(decisions)
    # One episode per fault: fetched back, since SQLite's bulk_create leaves no ids on them.
    episodes = []
    for job in built.jobs:
        job_faults = list(FaultInjection.objects.filter(job=job).order_by("id"))
        for k, fault in enumerate(job_faults):
            still_open = k == 0 and len(job_faults) > 1
            detected = now - timedelta(seconds=30 * (k + 1))
            episodes.append(
                RecoveryEpisode(
                    job=job,
                    fault=fault,
                    strategy=job.strategy,
                    stage="count",
                    action="promote",
                    detected_at=detected,
                    recovered_at=None if still_open else detected + timedelta(seconds=3),
                    downtime_s=None if still_open else 1.5,
                    recovery_time_s=None if still_open else 3.0,
                    peak_p99_ms=None if still_open else 2500.0,
                    watched_s=None if still_open else 3.0,
                    lost=None if still_open else 0,
                    duplicates=None if still_open else 0,
                )
            )
        built.episodes[job.pk] = len(job_faults)
        built.open_episodes[job.pk] = 1 if len(job_faults) > 1 else 0
    RecoveryEpisode.objects.bulk_create(episodes)
    for node in built.nodes:
        for i in range(samples):
            at = now - timedelta(seconds=10 * i)
            for name in NODE_ROW_METRICS:
                samples_rows.append(MetricSample(at=at, node=node, name=name, value=0.4))
    MetricSample.objects.bulk_create(samples_rows, batch_size=2000)
    return built


def table_rows(component, table_id: str) -> int:
    """How many body rows the table with id `table_id` inside a Dash tree has (0 when the
    table is not there, e.g. replaced by its "none yet" line)."""
    found = _find(component, table_id)
    if found is None:
        return 0
    _, body = found.children
    return len(body.children)


def _find(component, component_id: str):
    if isinstance(component, list | tuple):
        for child in component:
            hit = _find(child, component_id)
            if hit is not None:
                return hit
        return None
    if component is None or isinstance(component, str | int | float):
        return None
    if getattr(component, "id", None) == component_id:
        return component
    return _find(getattr(component, "children", None), component_id)
