"""A fleet for tests, timings and screenshots at the size Backstop supervises: hundreds of jobs on
tens of nodes (`seed_fleet(jobs=200, nodes=50)`), deterministic like tests/dash/seed.py. The
rows only: no controller is asked to launch the jobs (`manage.py page_timing` times the pages on
it, in a database of its own).

Jobs cycle through the strategies and two topologies; most run, some start, some failed or
stopped. Each live job has a primary per stage (split and count) and, under adaptive and
active-all, a standby for count on another node, with the policy's verdict on it. Job-level
throughput and latency and every node's usage and Q are sampled over the last `minutes`;
a few jobs have an open recovery episode, more have closed ones, with their faults. Rows are
written with bulk_create, so 200 jobs and 50 nodes take seconds.

    .venv/bin/python manage.py shell -c "from bench.fleet.seed import seed_fleet; \
        seed_fleet(200, 50, minutes=30)"    # into DATABASE_URL's database, for a dev server
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.test.utils import override_settings
from django.utils import timezone

from console.models import FaultInjection, Job, MetricSample, Node, RecoveryEpisode, Replica, Team
from console.services.jobs import create_job
from console.services.teams import DEFAULT_TEAM

STRATEGIES = ("adaptive", "restart-all", "local-restart", "active-all")
WITH_STANDBY = ("adaptive", "active-all")
TOPOLOGIES = ("wordcount", "topn")
STAGES = {"wordcount": ("split", "count"), "topn": ("parse", "topn")}


@dataclass
class Fleet:
    """What seed_fleet made, for assertions."""

    jobs: list[Job]
    nodes: list[Node]
    now: datetime

    @property
    def live(self) -> list[Job]:
        return [job for job in self.jobs if job.is_live]


def _status(index: int) -> str:
    """Mostly running; every 20th failed, every 20th (offset) stopped, every 25th starting."""
    if index % 20 == 7:
        return Job.Status.FAILED
    if index % 20 == 13:
        return Job.Status.STOPPED
    if index % 25 == 3:
        return Job.Status.STARTING
    return Job.Status.RUNNING


def _make_job(status: str, **fields) -> Job:
    """A job with its operators, made by the real service, in `status`; its launch is not
    sent to any controller (the fleet's rows are for reading)."""
    with override_settings(CONTROLLER_DISPATCH=False):
        job = create_job(team=Team.named(DEFAULT_TEAM), **fields)
    Job.objects.filter(pk=job.pk).update(status=status)
    job.refresh_from_db()
    return job


def _node_usage(index: int, i: int) -> dict[str, float]:
    """Smooth, different per node: a few nodes run hot (below the reserve), most do not."""
    base = 0.25 + 0.5 * ((index * 37) % 50) / 50
    cpu = min(0.97, base + 0.08 * math.sin(i / 8 + index))
    mem = min(0.95, 0.2 + 0.6 * ((index * 11) % 50) / 50 + 0.04 * math.sin(i / 15 + index))
    disk = 0.10 + 0.05 * math.sin(i / 6 + index)
    net = 0.08 + 0.1 * ((index * 7) % 10) / 10 + 0.03 * math.sin(i / 4)
    q = 2.2 * (0.4 * (1 - cpu) + 0.3 * (1 - mem) + 0.15 * (1 - disk) + 0.15 * (1 - net))
    return {
        "cpu_util": cpu,
        "mem_util": mem,
        "disk_util": disk,
        "net_util": net,
        "cpu_idle": 1 - cpu,
        "mem_idle": 1 - mem,
        "disk_idle": 1 - disk,
        "bw_idle": 1 - net,
        "q_score": q,
        "warm_spares": float(index % 3),
    }


def seed_fleet(
    jobs: int = 200,
    nodes: int = 50,
    minutes: float = 2,
    job_step_s: int = 5,
    node_step_s: int = 5,
    now: datetime | None = None,
    prefix: str = "",
) -> Fleet:
    """`jobs` jobs on `nodes` nodes with `minutes` of metrics (see the module docstring);
    `prefix` starts every node and job name, for a second fleet beside a first."""
    now = now or timezone.now()
    node_rows = Node.objects.bulk_create(
        Node(
            name=f"{prefix}node-{index + 1:02d}",
            cpu_total=8.0,
            mem_total_mb=16384.0,
            # Two nodes in fifty are down: the console must point at them.
            state=Node.State.DOWN if index % 25 == 4 else Node.State.UP,
            last_heartbeat=now - timedelta(seconds=2 if index % 25 != 4 else 600),
        )
        for index in range(nodes)
    )
    node_rows = list(Node.objects.filter(name__in=[n.name for n in node_rows]).order_by("name"))
    up = [n for n in node_rows if n.state == Node.State.UP]
    made = []
    for index in range(jobs):
        strategy = STRATEGIES[index % len(STRATEGIES)]
        topology = TOPOLOGIES[(index // len(STRATEGIES)) % len(TOPOLOGIES)]
        made.append(
            _make_job(
                _status(index),
                topology=topology,
                name=f"{prefix}{topology[:2]}-{strategy}-{index:03d}",
                strategy=strategy,
                params={"rate": 50 + index % 7 * 10},
            )
        )
    replicas = []
    for index, job in enumerate(made):
        if not job.is_live:
            continue
        split, count = STAGES[job.topology]
        for offset, stage in enumerate((split, count)):
            node = up[(index * 2 + offset) % len(up)]
            replicas.append(
                Replica(
                    job=job,
                    replica_id=f"{job.key}/{stage}-primary",
                    stage=stage,
                    node=node,
                    role=Replica.Role.PRIMARY,
                    state=Replica.State.RUNNING,
                    pid=10_000 + len(replicas),
                    last_heartbeat=now,
                    nice=-5 if job.strategy in WITH_STANDBY else 0,
                )
            )
        if job.strategy in WITH_STANDBY:
            node = up[(index * 2 + 7) % len(up)]
            replicas.append(
                Replica(
                    job=job,
                    replica_id=f"{job.key}/{count}-standby",
                    stage=count,
                    node=node,
                    role=Replica.Role.STANDBY,
                    state=Replica.State.RUNNING,
                    pid=10_000 + len(replicas),
                    last_heartbeat=now,
                    nice=5,
                    batch_every_s=6.0,
                    placement={
                        "operator": count,
                        "node": node.name,
                        "rule": "kept" if index % 3 else "added",
                        "reason": f"{node.name} has the highest Q apart from the primary's",
                        "reserve": "kept after this cycle: cpu 41% / mem 52% free vs reserve 20%",
                        "at": now.isoformat(),
                    },
                )
            )
    Replica.objects.bulk_create(replicas, batch_size=1000)
    samples = []
    steps = max(1, int(minutes * 60 // job_step_s))
    for index, job in enumerate(made):
        if not job.is_live:
            continue
        for i in range(steps):
            at = now - timedelta(seconds=(steps - 1 - i) * job_step_s)
            rate = job.params.get("rate", 50)
            for name, value in (
                ("throughput_eps", rate * (1 + 0.1 * math.sin(i / 9 + index))),
                ("latency_p50_ms", 600 + 80 * math.sin(i / 7 + index)),
                ("latency_p99_ms", 1200 + 150 * math.sin(i / 5 + index) + 40 * (index % 9)),
            ):
                samples.append(MetricSample(at=at, job=job, stage="", name=name, value=value))
    node_steps = max(1, int(minutes * 60 // node_step_s))
    for index, node in enumerate(node_rows):
        for i in range(node_steps):
            at = now - timedelta(seconds=(node_steps - 1 - i) * node_step_s)
            for name, value in _node_usage(index, i).items():
                samples.append(MetricSample(at=at, node=node, name=name, value=value))
    MetricSample.objects.bulk_create(samples, batch_size=5000)
    faults, episodes = [], []
    for index, job in enumerate(made):
        if index % 5:
            continue
        _, count = STAGES[job.topology]
        detected = now - timedelta(minutes=1 + index % 50)
        fault = FaultInjection(
            job=job,
            kind=FaultInjection.Kind.KILL_DRIVER,
            target_operator=count,
            outcome=FaultInjection.Outcome.INJECTED,
            injected_at=detected - timedelta(seconds=1),
        )
        faults.append(fault)
        still_open = job.is_live and index % 25 == 0
        episodes.append(
            RecoveryEpisode(
                job=job,
                fault=fault,
                strategy=job.strategy,
                stage=count,
                action="promote" if job.strategy in WITH_STANDBY else "restart-stage",
                detected_at=detected,
                recovered_at=None if still_open else detected + timedelta(seconds=4),
                downtime_s=None if still_open else 1.2 + index % 4,
                recovery_time_s=None if still_open else 4.0 + index % 6,
                peak_p99_ms=None if still_open else 2500.0 + 10 * index,
                watched_s=None if still_open else 4.0 + index % 6,
                lost=None if still_open else 0,
                duplicates=None if still_open else 0,
            )
        )
    FaultInjection.objects.bulk_create(faults)
    for episode, fault in zip(episodes, faults, strict=True):
        episode.fault = fault
    RecoveryEpisode.objects.bulk_create(episodes)
    return Fleet(jobs=made, nodes=node_rows, now=now)
