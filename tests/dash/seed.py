"""A small, deterministic cluster for console tests and screenshots.

Three nodes, two running word-count jobs with different strategies, operator scores and their
history, replicas, half an hour of job and node metrics, and one fault with its recovery per job.
Values follow smooth curves (no randomness) so tests and screenshots are reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from bench.row_sizes import ERROR_TAIL
from console.models import (
    ControlDecision,
    Job,
    JobUpgrade,
    MetricSample,
    Node,
    Operator,
    RegisteredTopology,
    Replica,
    Team,
)
from console.services.teams import DEFAULT_TEAM
from tests.factories import EpisodeFactory, FaultFactory, NodeFactory, ReplicaFactory, make_job

# name: (mode, S, R, L, P, interval, fr)
OPERATOR_SCORES = {
    "source": ("passive", 0.1, 0.05, 0.5, 0.21, 10.0, 0.02),
    "split": ("passive", 0.1, 0.15, 1.0, 0.39, 6.0, 0.04),
    "count": ("active", 0.5, 0.25, 1.0, 0.58, 5.0, 0.09),
    "sink": ("passive", 0.1, 0.05, 0.5, 0.21, 12.0, 0.01),
}


@dataclass
class Seeded:
    """What seed_console created, for assertions."""

    nodes: list[Node]
    adaptive: Job
    baseline: Job
    now: datetime


def _job_metrics(job: Job, start: datetime, steps: int, step_s: int, outage: tuple[int, int]):
    rows = []
    for i in range(steps):
        at = start + timedelta(seconds=i * step_s)
        down = outage[0] <= i < outage[1]
        catch_up = outage[1] <= i < outage[1] + 4
        throughput = 0.0 if down else 480 + 40 * math.sin(i / 9)
        p50 = 900 + 80 * math.sin(i / 7) + (2500 if catch_up else 0)
        p99 = 1400 + 150 * math.sin(i / 5) + (7000 if catch_up else 0)
        for name, value in (
            ("throughput_eps", throughput),
            ("latency_p50_ms", p50),
            ("latency_p99_ms", p99),
        ):
            rows.append(MetricSample(at=at, job=job, stage="", name=name, value=value))
        if i % 6 == 0:  # operator scores are recomputed every policy cycle, not every sample
            for op, (_, s, r, ell, p, interval, fr) in OPERATOR_SCORES.items():
                drift = 0.03 * math.sin(i / 40)
                for name, value in (
                    ("priority", p + drift),
                    ("type_score", s),
                    ("resource_score", r + drift),
                    ("dependency_score", ell),
                    ("checkpoint_interval_s", interval * (1 + 0.2 * math.sin(i / 30))),
                    ("predicted_fault_rate", fr * (1 + math.sin(i / 25) / 2)),
                ):
                    rows.append(MetricSample(at=at, job=job, stage=op, name=name, value=value))
    return rows


def _node_metrics(node: Node, index: int, start: datetime, steps: int, step_s: int):
    rows = []
    for i in range(steps):
        at = start + timedelta(seconds=i * step_s)
        cpu = 0.35 + 0.15 * index + 0.1 * math.sin(i / 8 + index)
        mem = 0.30 + 0.12 * index + 0.05 * math.sin(i / 15 + index)
        disk = 0.10 + 0.05 * math.sin(i / 6 + index)
        net = 0.08 + 0.04 * index + 0.03 * math.sin(i / 4)
        for name, value in (
            ("cpu_util", cpu),
            ("mem_util", mem),
            ("disk_util", disk),
            ("net_util", net),
            ("cpu_idle", 1 - cpu),
            ("mem_idle", 1 - mem),
            ("disk_idle", 1 - disk),
            ("bw_idle", 1 - net),
            (
                "q_score",
                2.2 * (0.4 * (1 - cpu) + 0.3 * (1 - mem) + 0.15 * (1 - disk) + 0.15 * (1 - net)),
            ),
        ):
            rows.append(MetricSample(at=at, node=node, name=name, value=value))
    return rows


def _decisions(job: Job, detected: datetime, action: str) -> None:
    """What the controller would have written around the fault: placement, failure, response."""
    replica_id = f"{job.key}-count-primary"
    rows = [
        (
            detected - timedelta(minutes=10),
            "set-interval",
            "split",
            "",
            "",
            "no fault in the last cycle: interval 5.0 s -> 6.0 s",
            {},
        ),
        (
            detected,
            "failure",
            "count",
            "node-b",
            replica_id,
            f"{replica_id}: ReplicaExited",
            {"error_tail": ERROR_TAIL},
        ),
        (
            detected,
            action,
            "count",
            "node-c" if action == "promote" else "node-b",
            replica_id,
            "standby on node-c promoted, fencing epoch 1"
            if action == "promote"
            else "restarted the fused query from its checkpoint",
            {},
        ),
    ]
    if action == "promote":
        rows.insert(
            0,
            (
                detected - timedelta(minutes=12),
                "add-standby",
                "count",
                "node-c",
                "",
                "P=0.58 above 0.40; node-c has the highest Q apart from the primary's",
                {},
            ),
        )
    for at, kind, stage, node, replica, reason, detail in rows:
        ControlDecision.objects.create(
            job=job,
            at=at,
            kind=kind,
            stage=stage,
            node=node,
            replica_id=replica,
            reason=reason,
            detail=detail,
        )


def seed_console(minutes: int = 30, step_s: int = 5, now: datetime | None = None) -> Seeded:
    """Create the demo cluster described in the module docstring; returns what it made."""
    now = now or timezone.now()
    nodes = [
        NodeFactory(name=name, cpu_total=4.0, mem_total_mb=8192.0, last_heartbeat=now)
        for name in ("node-a", "node-b", "node-c")
    ]
    adaptive = make_job(Job.Status.RUNNING, name="wc-adaptive", strategy=Job.Strategy.ADAPTIVE)
    baseline = make_job(Job.Status.RUNNING, name="wc-restart", strategy=Job.Strategy.RESTART_ALL)
    for job in (adaptive, baseline):
        for op, (mode, s, r, ell, p, interval, fr) in OPERATOR_SCORES.items():
            is_active = mode == "active" and job == adaptive
            Operator.objects.filter(job=job, name=op).update(
                stage=op,
                mode="active" if is_active else "passive",
                type_score=s,
                resource_score=r,
                dependency_score=ell,
                priority=p,
                checkpoint_interval_s=interval,
                predicted_fault_rate=fr,
            )
    placements = [
        (adaptive, "split", nodes[0], Replica.Role.PRIMARY),
        (adaptive, "count", nodes[1], Replica.Role.PRIMARY),
        (adaptive, "count", nodes[2], Replica.Role.STANDBY),
        (adaptive, "sink", nodes[0], Replica.Role.PRIMARY),
        (baseline, "job", nodes[2], Replica.Role.PRIMARY),
    ]
    for job, stage, node, role in placements:
        ReplicaFactory(
            job=job, stage=stage, node=node, role=role, replica_id=f"{job.key}-{stage}-{role}"
        )
    # CPU priorities as the replicas report them: adaptive's primaries above the normal level,
    # its caught-up standby below it and paced; the plain-Spark baseline at the normal level.
    Replica.objects.filter(job=adaptive, role=Replica.Role.PRIMARY).update(nice=-5)
    Replica.objects.filter(job=adaptive, role=Replica.Role.STANDBY).update(
        nice=5, batch_every_s=3.0
    )
    Replica.objects.filter(job=baseline).update(nice=0)
    # Why the policy keeps the standby where it is (what a policy cycle stores on the replica).
    Replica.objects.filter(job=adaptive, stage="count", role=Replica.Role.STANDBY).update(
        placement={
            "operator": "count",
            "node": "node-c",
            "rule": "kept",
            "reason": "kept: started 40 s ago; a standby runs 120 s on its node before a move "
            "is considered",
            "reserve": "kept after this cycle: cpu 48% / mem 57% free vs reserve 20%",
            "at": now.isoformat(),
        }
    )
    steps = minutes * 60 // step_s
    start = now - timedelta(seconds=steps * step_s)
    rows = []
    for job, outage in ((adaptive, (200, 201)), (baseline, (250, 255))):
        rows += _job_metrics(job, start, steps, step_s, outage)
    for index, node in enumerate(nodes):
        rows += _node_metrics(node, index, start, steps, step_s)
    MetricSample.objects.bulk_create(rows, batch_size=2000)
    for job, outage, downtime, recovery, action in (
        (adaptive, (200, 201), 2.1, 9.5, "promote"),
        (baseline, (250, 255), 24.0, 41.0, "restart-job"),
    ):
        detected = start + timedelta(seconds=outage[0] * step_s)
        fault = FaultFactory(
            job=job,
            kind="kill-driver",
            target_operator="count",
            outcome="injected",
            injected_at=detected - timedelta(seconds=1),
        )
        _decisions(job, detected, action)
        EpisodeFactory(
            job=job,
            fault=fault,
            strategy=job.strategy,
            stage="count",
            action=action,
            detected_at=detected,
            recovered_at=detected + timedelta(seconds=recovery),
            downtime_s=downtime,
            recovery_time_s=recovery,
            peak_p99_ms=8400.0 if action == "promote" else 26_000.0,
            lost=0,
            duplicates=0,
            phases=_phase_marks(fault.injected_at.timestamp(), action),
        )
    return Seeded(nodes=nodes, adaptive=adaptive, baseline=baseline, now=now)


def _phase_marks(fault_at: float, action: str) -> dict:
    """Marks of a recovery's phases (console/policy/recovery_phases.py) as a promotion (no
    process start, no restore) or a restart takes them, in seconds after the fault."""
    steps = {"detected": 1.0, "decided": 1.02, "commanded": 1.05}
    if action == "promote":
        steps |= {"caught_up": 1.6, "first_output": 2.1}
    else:
        steps |= {"process_started": 3.0, "state_restored": 14.0, "caught_up": 21.0,
                  "first_output": 24.0}  # fmt: skip
    return {"fault": fault_at, "replica": "r9", **{k: fault_at + v for k, v in steps.items()}}


# The user job of docs/JOBS.md (jobs/examples/clickstream.py): name: (kind, upstream, P, interval)
ACTIVITY_OPERATORS = {
    "clicks": ("source", [], 0.2, 10.0),
    "real_pages": ("filter", ["clicks"], 0.3, 8.0),
    "per_window": ("window_aggregate", ["real_pages"], 0.6, 5.0),
    "results": ("sink", ["per_window"], 0.2, 12.0),
}
ACTIVITY_STAGE = "per_window"


@dataclass
class SeededUpgrades:
    """What seed_upgraded_job created: the job, its confirmed and its validating upgrade."""

    job: Job
    confirmed: JobUpgrade
    validating: JobUpgrade
    now: datetime


def seed_upgraded_job(
    seeded: Seeded, requested_by=None, minutes: int = 30, step_s: int = 5
) -> SeededUpgrades:
    """A user job `clicks` (`activity`, three registered versions) on `seeded`'s nodes, upgraded
    from activity@1 to activity@2 twelve minutes ago (confirmed: the version history) and now to
    activity@3 with a parameter changed (validating: new version writes, the old one stands by).

    Rows only, as the controller would have left them: no module is imported or written.
    """
    now = seeded.now
    source = "# activity, version {}: the clickstream example of docs/JOBS.md\n"
    for version in (1, 2, 3):
        RegisteredTopology.objects.create(
            name="activity",
            version=version,
            module="examples.clickstream:activity",
            source=source.format(version),
            source_sha256=f"{version:064x}",
        )
    job = Job.objects.create(
        team=Team.named(DEFAULT_TEAM),
        name="clicks",
        topology="activity@3",  # green's version from the switch on (services.upgrades)
        strategy=Job.Strategy.ADAPTIVE,
        status=Job.Status.RUNNING,
        started_at=now - timedelta(hours=1),
    )
    for name, (kind, upstream, priority, interval) in ACTIVITY_OPERATORS.items():
        downstream = [n for n, spec in ACTIVITY_OPERATORS.items() if name in spec[1]]
        in_stage = kind not in ("source", "sink")
        Operator.objects.create(
            job=job, name=name, kind=kind, upstream=upstream, downstream=downstream,
            stage=ACTIVITY_STAGE if in_stage else "",
            mode="active" if kind == "window_aggregate" else "passive",
            priority=priority, checkpoint_interval_s=interval,
        )  # fmt: skip
    blue, green = f"{ACTIVITY_STAGE}-2", f"{ACTIVITY_STAGE}-3"
    for replica_id, node, role in (
        (blue, seeded.nodes[0], Replica.Role.STANDBY),
        (green, seeded.nodes[1], Replica.Role.PRIMARY),
    ):
        ReplicaFactory(
            job=job, stage=ACTIVITY_STAGE, node=node, role=role,
            replica_id=Replica.full_id(job.key, replica_id),
        )  # fmt: skip
    steps = minutes * 60 // step_s
    start = now - timedelta(seconds=steps * step_s)
    rows = []
    for i in range(0, steps, 6):  # every policy cycle
        at = start + timedelta(seconds=i * step_s)
        for name, (_, _, priority, interval) in ACTIVITY_OPERATORS.items():
            for metric, value in (
                ("priority", priority + 0.03 * math.sin(i / 40)),
                ("checkpoint_interval_s", interval * (1 + 0.2 * math.sin(i / 30))),
                ("predicted_fault_rate", 0.02 + 0.01 * math.sin(i / 25)),
            ):
                rows.append(MetricSample(at=at, job=job, stage=name, name=metric, value=value))
    MetricSample.objects.bulk_create(rows, batch_size=2000)
    confirmed = JobUpgrade.objects.create(
        job=job, requested_by=requested_by, stage=ACTIVITY_STAGE,
        from_topology="activity@1", to_topology="activity@2",
        case=JobUpgrade.Case.REBUILD,
        reason="operator per_window: its state is incompatible (changed watermark); the new "
        "version rebuilds it from the job's input stream, which holds all 5210 entries ever "
        "added to it",
        status=JobUpgrade.Status.CONFIRMED, blue_replica=f"{ACTIVITY_STAGE}-1",
        green_replica=blue, switched_at=now - timedelta(minutes=12),
        ended_at=now - timedelta(minutes=11),
        outcome="the new version wrote for 60 s without a failure",
        gap_s=0.4, lost=0, duplicates=0,
    )  # fmt: skip
    validating = JobUpgrade.objects.create(
        job=job, requested_by=requested_by, stage=ACTIVITY_STAGE,
        from_topology="activity@2", to_topology="activity@3",
        from_params={}, to_params={"per_window.parallelism": "2"},
        case=JobUpgrade.Case.SEEDED,
        reason="the new version ran a batch on a copy of the running version's state "
        "(committed batch 342): it starts from that checkpoint",
        status=JobUpgrade.Status.VALIDATING, blue_replica=blue, green_replica=green,
        checkpoint_batch=342, switched_at=now - timedelta(seconds=40),
        result_preserving=True, results_compared=212, results_differing=0,
    )  # fmt: skip
    # requested_at is set on create; put it where the story has it.
    JobUpgrade.objects.filter(pk=confirmed.pk).update(requested_at=now - timedelta(minutes=14))
    JobUpgrade.objects.filter(pk=validating.pk).update(requested_at=now - timedelta(minutes=3))
    confirmed.refresh_from_db()
    validating.refresh_from_db()
    return SeededUpgrades(job=job, confirmed=confirmed, validating=validating, now=now)
