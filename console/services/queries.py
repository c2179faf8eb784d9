"""Queries that the REST API and the console's pages both read: the job list with its filters,
sorts and newest metrics, the fleet's totals, and the newest value of a metric. One place, so
a job list answers the same on a page and in the API. Plain arguments in, querysets or plain
Python out; callers pass the jobs a user may see (console.services.teams)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import (
    Count,
    Exists,
    F,
    FloatField,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from console.models import Job, MetricSample, Node, Replica
from console.models import RecoveryEpisode as Episode

# Job-level samples (throughput, latency of the whole job) carry no stage; per-operator history
# carries the operator's name in `stage`.
JOB_SCOPE = ""


def latest(names, **filters) -> dict[str, float]:
    """The newest value of each named metric matching `filters` (one indexed lookup per name).
    For one job or node; lists of them use `newest` inside one query instead."""
    values = {}
    for name in names:
        value = (
            MetricSample.objects.filter(name=name, **filters)
            .order_by("-at")
            .values_list("value", flat=True)
            .first()
        )
        if value is not None:
            values[name] = value
    return values


def newest(name: str, stage: str | None = None, **outer: str) -> Subquery:
    """The newest value of metric `name` for each row of an outer query, as a correlated
    subquery: `Job.objects.annotate(tp=newest("throughput_eps", stage="", job="pk"))` reads each
    job's newest sample through the (job, name, at) index within the one query that lists the
    jobs, where a lookup per row would cost a query per job."""
    rows = MetricSample.objects.filter(
        name=name, **{field_name: OuterRef(ref) for field_name, ref in outer.items()}
    )
    if stage is not None:
        rows = rows.filter(stage=stage)
    return Subquery(rows.order_by("-at").values("value")[:1], output_field=FloatField())


def _count_of(queryset: QuerySet) -> Coalesce:
    """How many rows of `queryset` (filtered on an OuterRef) belong to each outer row, as a
    subquery: 0, not NULL, for none."""
    counted = queryset.order_by().values("job_id").annotate(n=Count("id")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


ENDED_REPLICA_STATES = (Replica.State.STOPPED, Replica.State.FAILED)


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a list shows (the overview's filters and the API's query parameters): empty
    fields filter nothing. `node`: jobs with a live replica on the node of that name;
    `open_recovery`: True for jobs with a recovery episode still being measured (no
    `watched_s` yet), False for jobs without one; `search`: part of the job's name."""

    status: tuple[str, ...] = ()
    strategy: tuple[str, ...] = ()
    topology: tuple[str, ...] = ()
    node: str = ""
    open_recovery: bool | None = None
    search: str = ""


# Sort keys of job lists -> ORDER BY; every order ends with the id so pages never overlap.
JOB_SORTS = {
    "newest": ("-created_at", "-id"),
    "oldest": ("created_at", "id"),
    "name": ("name", "id"),
    "status": ("status", "name", "id"),
    "strategy": ("strategy", "name", "id"),
    "topology": ("topology", "name", "id"),
    "throughput": (F("throughput_eps").desc(nulls_last=True), "id"),
    "p99": (F("latency_p99_ms").desc(nulls_last=True), "id"),
    "open_episodes": ("-open_episodes", "-created_at", "-id"),
}
DEFAULT_JOB_SORT = "newest"


def job_queryset(
    flt: JobFilter | None = None,
    sort: str = DEFAULT_JOB_SORT,
    now: datetime | None = None,
    recent_s: float = 3600,
    jobs: QuerySet | None = None,
) -> QuerySet:
    """Jobs of `jobs` (every job by default; callers pass the user's visible jobs) matching
    `flt`, sorted by `sort` (a key of JOB_SORTS), each annotated with its newest job-level
    throughput and p99 and its open and recent (`recent_s`) episode counts, all inside one
    query whatever the number of jobs."""
    flt = flt or JobFilter()
    now = now or timezone.now()
    jobs = Job.objects.all() if jobs is None else jobs
    if flt.status:
        jobs = jobs.filter(status__in=flt.status)
    if flt.strategy:
        jobs = jobs.filter(strategy__in=flt.strategy)
    if flt.topology:
        jobs = jobs.filter(topology__in=flt.topology)
    if flt.search:
        jobs = jobs.filter(name__icontains=flt.search)
    if flt.node:
        on_node = Replica.objects.filter(node__name=flt.node).exclude(
            state__in=ENDED_REPLICA_STATES
        )
        jobs = jobs.filter(pk__in=on_node.values("job_id"))
    open_episodes = Episode.objects.filter(job=OuterRef("pk"), watched_s__isnull=True)
    if flt.open_recovery is not None:
        has_open = Exists(open_episodes)
        jobs = jobs.filter(has_open if flt.open_recovery else ~has_open)
    jobs = jobs.annotate(
        throughput_eps=newest("throughput_eps", stage=JOB_SCOPE, job="pk"),
        latency_p99_ms=newest("latency_p99_ms", stage=JOB_SCOPE, job="pk"),
        open_episodes=_count_of(open_episodes),
        recent_episodes=_count_of(
            Episode.objects.filter(
                job=OuterRef("pk"), detected_at__gte=now - timedelta(seconds=recent_s)
            )
        ),
    )
    return jobs.order_by(*JOB_SORTS.get(sort, JOB_SORTS[DEFAULT_JOB_SORT]))


def fleet_totals(jobs: QuerySet | None = None) -> dict:
    """The fleet of `jobs` (every job by default) in four queries: jobs by status, their live
    replicas by role, nodes by state (every node: nodes belong to no team), and their open
    recovery episodes (and how many jobs have one)."""
    statuses = [value for value, _ in Job.Status.choices]
    jobs = Job.objects.all() if jobs is None else jobs
    job_ids = jobs.values("pk")
    jobs = jobs.order_by().aggregate(
        total=Count("id"), **{status: Count("id", filter=Q(status=status)) for status in statuses}
    )
    replicas = (
        Replica.objects.filter(job__in=job_ids)
        .exclude(state__in=ENDED_REPLICA_STATES)
        .order_by()
        .aggregate(
            total=Count("id"),
            primary=Count("id", filter=Q(role=Replica.Role.PRIMARY)),
            standby=Count("id", filter=Q(role=Replica.Role.STANDBY)),
        )
    )
    node_states = [value for value, _ in Node.State.choices]
    nodes = Node.objects.order_by().aggregate(
        total=Count("id"), **{state: Count("id", filter=Q(state=state)) for state in node_states}
    )
    episodes = (
        Episode.objects.filter(watched_s__isnull=True, job__in=job_ids)
        .order_by()
        .aggregate(open=Count("id"), jobs=Count("job_id", distinct=True))
    )
    return {
        "jobs": {
            "total": jobs["total"],
            "live": sum(jobs[s] for s in Job.LIVE_STATUSES),
            "by_status": {status: jobs[status] for status in statuses},
        },
        "replicas": replicas,
        "nodes": {
            "total": nodes["total"],
            "up": nodes[Node.State.UP],
            "down": nodes["total"] - nodes[Node.State.UP],
            "by_state": {state: nodes[state] for state in node_states},
        },
        "open_recoveries": episodes["open"],
        "jobs_with_open_recoveries": episodes["jobs"],
    }
