"""Database queries behind the console pages.

Every function takes plain arguments and returns plain Python (lists of dicts) or pandas
DataFrames, so figure builders never touch the ORM and callbacks stay thin. Time series are
averaged into buckets inside the database: a day of 1 s samples comes back as at most
`max_points` rows per series, whatever the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pandas as pd
from django.db.models import (
    Avg,
    Case,
    Count,
    F,
    FloatField,
    Func,
    IntegerField,
    Max,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    When,
)
from django.utils import timezone

from console.models import (
    ControlDecision,
    FaultInjection,
    Job,
    JobUpgrade,
    MetricSample,
    Node,
    Operator,
    Policy,
    PredictorTraining,
    RegisteredTopology,
    Replica,
)
from console.models import RecoveryEpisode as Episode
from console.services.kafka_status import is_kafka
from console.services.queries import (
    DEFAULT_JOB_SORT,
    ENDED_REPLICA_STATES,
    JOB_SCOPE,
    JobFilter,
    job_queryset,
    newest,
)
from console.services.upgrades import current_upgrade_params

JOB_METRICS = ("throughput_eps", "latency_p50_ms", "latency_p99_ms")
NODE_UTIL_METRICS = ("cpu_util", "mem_util", "disk_util", "net_util")
NODE_IDLE_METRICS = ("cpu_idle", "mem_idle", "disk_idle", "bw_idle")
OPERATOR_METRICS = (
    "priority",
    "type_score",
    "resource_score",
    "dependency_score",
    "checkpoint_interval_s",
    "predicted_fault_rate",
)
# ControlDecision kinds that describe something breaking rather than the controller acting.
FAILURE_KINDS = ("failure",)
SERIES_COLUMNS = ["at", "job_id", "node_id", "stage", "name", "value"]


class EpochBucket(Func):
    """floor(seconds since 1970 / width): the time bucket a timestamp falls into.

    PostgreSQL uses date_part('epoch', ...) (a double: EXTRACT's numeric made the buckets of
    a fleet's samples a quarter slower); SQLite (3.38+) uses unixepoch(). `width` is an int
    formatted into the SQL, never user text.
    """

    output_field = IntegerField()
    template = "CAST(FLOOR(date_part('epoch', %(expressions)s) / %(width)s) AS BIGINT)"

    def __init__(self, expression, width: int):
        super().__init__(expression, width=int(width))

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(
            compiler, connection, template="(unixepoch(%(expressions)s) / %(width)s)"
        )


def bucket_width(window_s: float, max_points: int) -> int:
    """Whole seconds per bucket so that `window_s` gives at most about `max_points` buckets."""
    return max(1, math.ceil(window_s / max_points))


def metric_series(
    names,
    window_s: float,
    *,
    max_points: int,
    job_ids=None,
    node_ids=None,
    stage: str | None = None,
    exclude_job_scope: bool = False,
    end: datetime | None = None,
) -> pd.DataFrame:
    """Bucket averages of the named metrics over the last `window_s` seconds before `end`.

    Filter by jobs or nodes, and by `stage` ("" for job-level rows); `exclude_job_scope` keeps
    only per-operator rows. Returns a DataFrame with SERIES_COLUMNS, sorted by time; `at` is the
    start of each bucket (UTC).
    """
    end = end or timezone.now()
    width = bucket_width(window_s, max_points)
    rows = MetricSample.objects.filter(
        name__in=list(names), at__gt=end - timedelta(seconds=window_s), at__lte=end
    )
    if job_ids is not None:
        rows = rows.filter(job_id__in=list(job_ids))
    if node_ids is not None:
        rows = rows.filter(node_id__in=list(node_ids))
    if stage is not None:
        rows = rows.filter(stage=stage)
    if exclude_job_scope:
        rows = rows.exclude(stage=JOB_SCOPE)
    grouped = (
        rows.annotate(bucket=EpochBucket("at", width))
        .values("job_id", "node_id", "stage", "name", "bucket")
        .annotate(value=Avg("value"))
        .order_by("bucket")
    )
    frame = pd.DataFrame.from_records(
        list(grouped), columns=["job_id", "node_id", "stage", "name", "bucket", "value"]
    )
    frame["at"] = pd.to_datetime(frame["bucket"].astype("int64") * width, unit="s", utc=True)
    return frame[SERIES_COLUMNS]


def _job_row(job: Job) -> dict:
    return {
        "id": job.pk,
        "name": job.name,
        "topology": job.topology,
        "strategy": job.strategy,
        "status": job.status,
        "is_live": job.is_live,
        "throughput_eps": job.throughput_eps,
        "latency_p99_ms": job.latency_p99_ms,
        "open_episodes": job.open_episodes,
        "recent_episodes": job.recent_episodes,
        # For the lag column of jobs reading Kafka (console.dash.kafka_data.lag_totals).
        "key": job.key,
        "reads_kafka": is_kafka(job.source),
    }


def job_rows(now: datetime | None = None, recent_s: float = 3600, limit: int = 50) -> list[dict]:
    """Jobs, newest first, with their latest throughput and p99 and their episode counts.

    `recent_episodes` counts episodes detected in the last `recent_s` seconds.
    """
    return [_job_row(job) for job in job_queryset(now=now, recent_s=recent_s)[:limit]]


@dataclass
class JobPage:
    """One page of a job list: its rows, how many jobs match, the page shown (1-based, clamped
    to the pages there are) and how many pages there are."""

    rows: list[dict] = field(default_factory=list)
    matching: int = 0
    page: int = 1
    pages: int = 1


def job_page(
    flt: JobFilter | None = None,
    sort: str = DEFAULT_JOB_SORT,
    page: int = 1,
    page_size: int = 25,
    now: datetime | None = None,
    jobs: QuerySet | None = None,
) -> JobPage:
    """Page `page` of the jobs of `jobs` matching `flt` in `sort` order (two queries: the count
    and the page)."""
    jobs = job_queryset(flt, sort, now=now, jobs=jobs)
    matching = jobs.count()
    pages = max(1, math.ceil(matching / page_size))
    page = min(max(1, page), pages)
    start = (page - 1) * page_size
    rows = [_job_row(job) for job in jobs[start : start + page_size]]
    return JobPage(rows=rows, matching=matching, page=page, pages=pages)


def _job_detail_dict(job: Job) -> dict:
    return {
        "id": job.pk,
        "name": job.name,
        "topology": job.topology,
        "strategy": job.strategy,
        "status": job.status,
        "status_reason": job.status_reason,
        "is_live": job.is_live,
        "started_at": job.started_at,
        "key": job.key,
        "source": job.source or {},
        "sink": job.sink or {},
    }


def _among(jobs: QuerySet | None) -> QuerySet:
    """The jobs a reader sees (console.services.teams.jobs_visible_to), every job for None."""
    return Job.objects.all() if jobs is None else jobs


def job_detail(job_id: int, jobs: QuerySet | None = None) -> dict | None:
    """One job's header fields, or None when it is not among `jobs` (every job by default) or
    does not exist."""
    job = _among(jobs).filter(pk=job_id).first()
    return None if job is None else _job_detail_dict(job)


def job_details(job_ids, jobs: QuerySet | None = None) -> list[dict]:
    """The header fields of the jobs `job_ids` that exist, in the order given, in one query
    (a page comparing jobs would otherwise ask once per job)."""
    job_ids = list(job_ids)
    found = {job.pk: _job_detail_dict(job) for job in _among(jobs).filter(pk__in=job_ids)}
    # Each id as the query read it (a forged "3" is job 3, as with job_detail).
    as_pk = Job._meta.pk.get_prep_value
    return [found[as_pk(job_id)] for job_id in job_ids if as_pk(job_id) in found]


NODE_ROW_METRICS = (*NODE_UTIL_METRICS, *NODE_IDLE_METRICS, "q_score", "warm_spares")


def node_rows(jobs: QuerySet | None = None) -> list[dict]:
    """Every node with its latest utilisation, idle rates and Q, and the replicas it runs of
    `jobs` (every job by default; two queries whatever the number of nodes and replicas)."""
    live_replicas = (
        Replica.objects.filter(job__in=_among(jobs).values("pk"))
        .exclude(state__in=ENDED_REPLICA_STATES)
        .annotate(job_name=F("job__name"))
        .order_by("job__name", "stage")
        .values(
            "node_id", "role", "job_id", "job_name", "stage", "state", "replica_id", "nice",
            "batch_every_s",
        )
    )  # fmt: skip
    by_node: dict[int, dict[str, list]] = {}
    for replica in live_replicas:
        slot = by_node.setdefault(replica["node_id"], {"primary": [], "standby": []})
        slot[replica["role"]].append(
            {
                "job_id": replica["job_id"],
                "job": replica["job_name"],
                "stage": replica["stage"],
                "state": replica["state"],
                "replica_id": replica["replica_id"],
                "nice": replica["nice"],
                "batch_every_s": replica["batch_every_s"],
            }
        )
    nodes = Node.objects.annotate(
        **{f"newest_{name}": newest(name, node="pk") for name in NODE_ROW_METRICS}
    )
    rows = []
    for node in nodes:
        current = {name: getattr(node, f"newest_{name}") for name in NODE_ROW_METRICS}
        placed = by_node.get(node.pk, {"primary": [], "standby": []})
        rows.append(
            {
                "id": node.pk,
                "name": node.name,
                "state": node.state,
                "last_heartbeat": node.last_heartbeat,
                "cpu_total": node.cpu_total,
                "mem_total_mb": node.mem_total_mb,
                **{name: current[name] for name in (*NODE_UTIL_METRICS, *NODE_IDLE_METRICS)},
                "q_score": current["q_score"],
                "warm_spares": int(current["warm_spares"] or 0),
                "primaries": placed["primary"],
                "standbys": placed["standby"],
            }
        )
    return rows


def standby_rows(jobs: QuerySet | None = None) -> list[dict]:
    """Every live standby with its node, where its stage's primary runs, and the policy's latest
    verdict on why it sits there (`Replica.placement`; empty rule and reason until the policy has
    judged it, e.g. for a replacement the supervisor started after a promotion)."""
    live = list(
        Replica.objects.filter(job__in=_among(jobs).values("pk"))
        .exclude(state__in=(Replica.State.STOPPED, Replica.State.FAILED))
        .select_related("job", "node")
        .order_by("job__name", "stage")
    )
    primaries = {(r.job_id, r.stage): r.node.name for r in live if r.role == Replica.Role.PRIMARY}
    rows = []
    for replica in live:
        if replica.role != Replica.Role.STANDBY:
            continue
        verdict = replica.placement or {}
        rows.append(
            {
                "job_id": replica.job_id,
                "job": replica.job.name,
                "stage": replica.stage,
                "replica_id": replica.replica_id,
                "state": replica.state,
                "node": replica.node.name,
                "primary_node": primaries.get((replica.job_id, replica.stage)),
                "rule": verdict.get("rule", ""),
                "reason": verdict.get("reason", ""),
                "reserve": verdict.get("reserve", ""),
                "judged_at": datetime.fromisoformat(verdict["at"]) if "at" in verdict else None,
            }
        )
    return rows


def cluster_utilisation(window_s: float, max_points: int, end=None) -> pd.DataFrame:
    """Da-Stream's Rate_cpu and Rate_mem over time: sum of used over sum of total.

    Each node's utilisation is weighted by its capacity, over the nodes that reported in that
    bucket; summed inside the database, so 50 nodes cost no more rows than one. Columns: at,
    cpu, mem (fractions 0..1).
    """
    end = end or timezone.now()
    width = bucket_width(window_s, max_points)
    capacity = Case(
        When(name="cpu_util", then=F("node__cpu_total")),
        default=F("node__mem_total_mb"),
        output_field=FloatField(),
    )
    grouped = (
        MetricSample.objects.filter(
            name__in=("cpu_util", "mem_util"),
            # By node: the (node, name, at) index, not every sample of the window.
            node_id__in=list(Node.objects.values_list("pk", flat=True)),
            at__gt=end - timedelta(seconds=window_s),
            at__lte=end,
        )
        .annotate(bucket=EpochBucket("at", width), capacity=capacity)
        .values("name", "bucket")
        .annotate(used=Sum(F("value") * F("capacity")), total=Sum("capacity"))
        .order_by("bucket")
    )
    rows = [
        (row["bucket"], row["name"], row["used"] / row["total"] if row["total"] else None)
        for row in grouped
    ]
    if not rows:
        return pd.DataFrame(columns=["at", "cpu", "mem"])
    frame = pd.DataFrame.from_records(rows, columns=["bucket", "name", "rate"])
    wide = frame.pivot(index="bucket", columns="name", values="rate").reset_index()
    wide["at"] = pd.to_datetime(wide["bucket"].astype("int64") * width, unit="s", utc=True)
    wide = wide.rename(columns={"cpu_util": "cpu", "mem_util": "mem"})
    for column in ("cpu", "mem"):
        if column not in wide:
            wide[column] = float("nan")
    return wide[["at", "cpu", "mem"]].reset_index(drop=True)


def node_band(names, window_s: float, max_points: int, node_ids, end=None) -> pd.DataFrame:
    """Per metric and bucket, the lowest, mean and highest sample of every node together
    (columns name, at, low, mean, high): the range a fleet's lines would fill, in a few hundred
    rows whatever the number of nodes."""
    end = end or timezone.now()
    width = bucket_width(window_s, max_points)
    grouped = (
        MetricSample.objects.filter(
            name__in=list(names),
            node_id__in=list(node_ids),
            at__gt=end - timedelta(seconds=window_s),
            at__lte=end,
        )
        .annotate(bucket=EpochBucket("at", width))
        .values("name", "bucket")
        .annotate(low=Min("value"), mean=Avg("value"), high=Max("value"))
        .order_by("name", "bucket")
    )
    frame = pd.DataFrame.from_records(
        list(grouped), columns=["name", "bucket", "low", "mean", "high"]
    )
    frame["at"] = pd.to_datetime(frame["bucket"].astype("int64") * width, unit="s", utc=True)
    return frame[["name", "at", "low", "mean", "high"]]


def node_means(name: str, window_s: float, node_ids, end=None) -> dict[int, float]:
    """Each node's mean of metric `name` over the last `window_s` seconds (one grouped query)."""
    end = end or timezone.now()
    rows = (
        MetricSample.objects.filter(
            name=name,
            node_id__in=list(node_ids),
            at__gt=end - timedelta(seconds=window_s),
            at__lte=end,
        )
        .order_by()
        .values("node_id")
        .annotate(mean=Avg("value"))
    )
    return {row["node_id"]: row["mean"] for row in rows}


def operator_rows(job_id: int) -> list[dict]:
    """The job's operators with S, R, L, P, mode, interval and fr, in topology order."""
    return list(
        Operator.objects.filter(job_id=job_id)
        .order_by("id")
        .values(
            "name",
            "kind",
            "stage",
            "upstream",
            "downstream",
            "cpu_demand",
            "mem_demand_mb",
            "demand_source",
            "type_score",
            "resource_score",
            "dependency_score",
            "priority",
            "mode",
            "checkpoint_interval_s",
            "predicted_fault_rate",
            "fault_rate_source",
            "updated_at",
        )
    )


def operator_history(job_id: int, window_s: float, max_points: int, end=None) -> pd.DataFrame:
    """Per-operator history of P, S, R, L, interval and fr (`stage` is the operator's name)."""
    return metric_series(
        OPERATOR_METRICS,
        window_s,
        max_points=max_points,
        job_ids=[job_id],
        exclude_job_scope=True,
        end=end,
    )


def _episode_dict(episode: Episode) -> dict:
    fault = episode.fault
    return {
        "id": episode.pk,
        "job_id": episode.job_id,
        "job": episode.job.name,
        "strategy": episode.strategy,
        "stage": episode.stage,
        "action": episode.action,
        "detected_at": episode.detected_at,
        "recovered_at": episode.recovered_at,
        "downtime_s": episode.downtime_s,
        "recovery_time_s": episode.recovery_time_s,
        "peak_p99_ms": episode.peak_p99_ms,
        "reprotect_s": episode.reprotect_s,
        "watched_s": episode.watched_s,
        "lost": episode.lost,
        "duplicates": episode.duplicates,
        "phases": episode.phases,
        "fault_kind": fault.kind if fault else "",
        "fault_target": _fault_target(fault) if fault else "",
    }


def episode_rows(
    job_ids=None, since: datetime | None = None, limit: int = 200, jobs: QuerySet | None = None
) -> list[dict]:
    """Recovery episodes of `jobs` (every job by default), newest first, optionally for some
    of them (`job_ids`) and since a time."""
    episodes = Episode.objects.filter(job__in=_among(jobs).values("pk")).select_related(
        "job", "fault", "fault__target_node"
    )
    if job_ids is not None:
        episodes = episodes.filter(job_id__in=list(job_ids))
    if since is not None:
        episodes = episodes.filter(Q(detected_at__gte=since) | Q(watched_s__isnull=True))
    return [_episode_dict(e) for e in episodes.order_by("-detected_at")[:limit]]


def strategy_comparison(jobs: QuerySet | None = None) -> list[dict]:
    """Per strategy: number of episodes, the mean downtime and recovery time, the worst (highest)
    peak p99 of any episode (the same figure as the reports' `peak_p99_ms`), and the total lost
    and duplicated events, over all recovered episodes."""
    return list(
        Episode.objects.filter(recovered_at__isnull=False, job__in=_among(jobs).values("pk"))
        .values("strategy")
        .annotate(
            episodes=Count("id"),
            downtime_s=Avg("downtime_s"),
            recovery_time_s=Avg("recovery_time_s"),
            peak_p99_ms=Max("peak_p99_ms"),
            lost=Sum("lost"),
            duplicates=Sum("duplicates"),
        )
        .order_by("strategy")
    )


def _fault_target(fault: FaultInjection) -> str:
    if fault.target_operator:
        return fault.target_operator
    return fault.target_node.name if fault.target_node else ""


def fault_rows(
    job_ids=None, since: datetime | None = None, limit: int = 100, jobs: QuerySet | None = None
) -> list[dict]:
    """Fault requests on `jobs` (every job by default), newest first, with who asked and what
    came of it."""
    faults = FaultInjection.objects.filter(job__in=_among(jobs).values("pk")).select_related(
        "job", "target_node", "requested_by"
    )
    if job_ids is not None:
        faults = faults.filter(job_id__in=list(job_ids))
    if since is not None:
        faults = faults.filter(requested_at__gte=since)
    return [
        {
            "id": fault.pk,
            "job_id": fault.job_id,
            "job": fault.job.name,
            "kind": fault.kind,
            "target": _fault_target(fault),
            "requested_at": fault.requested_at,
            "injected_at": fault.injected_at,
            # The time the fault hit, or when it was asked for while still pending.
            "at": fault.injected_at or fault.requested_at,
            "outcome": fault.outcome,
            "detail": fault.outcome_detail,
            "requested_by": fault.requested_by.username if fault.requested_by else "schedule",
        }
        for fault in faults.order_by("-requested_at")[:limit]
    ]


def _decision_dict(decision) -> dict:
    detail = decision.detail or {}
    return {
        "id": decision.pk,
        "at": decision.at,
        "kind": decision.kind,
        "operator": decision.operator or decision.stage,
        "node": decision.node,
        "replica_id": decision.replica_id,
        "reason": decision.reason,
        "error_tail": detail.get("error_tail", ""),
    }


def recent_decisions(job_id: int, limit: int = 50) -> list[dict]:
    """The controller's latest decisions for a job, newest first, with their reasons."""
    decisions = ControlDecision.objects.filter(job_id=job_id).order_by("-at", "-id")[:limit]
    return [_decision_dict(d) for d in decisions]


def failure_history(job_id: int, limit: int = 50) -> list[dict]:
    """Failures of a job's replicas, newest first, each with the controller's response.

    The response is the first decision at or after the failure that is not itself a failure,
    on the same replica (the controller records the pair together), or on the same stage when
    the failure names no replica. Two queries whatever the number of failures: the failures,
    each with its response's id found by a correlated subquery, then those responses.
    """

    def first_response(same_target: dict) -> Subquery:
        responses = (
            ControlDecision.objects.filter(job_id=OuterRef("job_id"), at__gte=OuterRef("at"))
            .filter(**{name: OuterRef(column) for name, column in same_target.items()})
            .exclude(kind__in=FAILURE_KINDS)
            .order_by("at", "id")
        )
        return Subquery(responses.values("pk")[:1], output_field=IntegerField())

    failures = list(
        ControlDecision.objects.filter(job_id=job_id, kind__in=FAILURE_KINDS)
        .annotate(
            # A failure without a replica id is matched on its stage and operator instead.
            response_id=Case(
                When(
                    replica_id="", then=first_response({"stage": "stage", "operator": "operator"})
                ),
                default=first_response({"replica_id": "replica_id"}),
                output_field=IntegerField(),
            )
        )
        .order_by("-at", "-id")[:limit]
    )
    responses = ControlDecision.objects.in_bulk(
        {failure.response_id for failure in failures if failure.response_id is not None}
    )
    rows = []
    for failure in failures:
        response = responses.get(failure.response_id)
        row = _decision_dict(failure)
        row["response"] = f"{response.kind}: {response.reason}" if response else ""
        rows.append(row)
    return rows


def policy_thresholds() -> dict:
    """The policy version in force: version, author, reason and every tunable field."""
    # The newest version with its author in one query (Policy.current() and then
    # `created_by` would be two); current() writes the defaults when there is no version yet.
    policy = (
        Policy.objects.select_related("created_by").order_by("-version").first() or Policy.current()
    )
    return {
        "version": policy.version,
        "created_at": policy.created_at,
        "created_by": policy.created_by.username if policy.created_by else "",
        "reason": policy.reason,
        "values": {name: getattr(policy, name) for name in Policy.threshold_field_names()},
    }


def predictor_trainings(limit: int = 8) -> list[dict]:
    """The fault predictor's newest training runs, newest first (the first one is in force)."""
    return list(
        PredictorTraining.objects.order_by("-trained_at").values(
            "id",
            "trained_at",
            "window_s",
            "samples",
            "failures",
            "holdout_samples",
            "r2",
            "mae",
            "prior_mae",
            "mse",
            "prior_mse",
            "used",
            "reason",
        )[:limit]
    )


def live_job_choices(jobs: QuerySet | None = None) -> list[dict]:
    """Dropdown options for the jobs of `jobs` that can be stopped."""
    return [
        {"label": f"{name} (#{pk}, {status})", "value": pk}
        for pk, name, status in _among(jobs)
        .filter(status__in=Job.LIVE_STATUSES + ("created",))
        .order_by("-created_at")
        .values_list("pk", "name", "status")
    ]


def job_choices(limit: int = 50, jobs: QuerySet | None = None) -> list[dict]:
    """Dropdown options for the jobs of `jobs` (every job by default), newest first."""
    return [
        {"label": f"{name} ({strategy}, #{pk})", "value": pk}
        for pk, name, strategy in _among(jobs)
        .order_by("-created_at")
        .values_list("pk", "name", "strategy")[:limit]
    ]


def node_choices() -> list[dict]:
    """Dropdown options for nodes."""
    return [{"label": n, "value": pk} for pk, n in Node.objects.values_list("pk", "name")]


def stage_placement(job_id: int) -> list[dict]:
    """Where each live replica of a job runs."""
    return list(
        Replica.objects.filter(job_id=job_id)
        .exclude(state__in=(Replica.State.STOPPED, Replica.State.FAILED))
        .annotate(node_name=F("node__name"))
        .order_by("stage", "role")
        .values(
            "stage",
            "role",
            "state",
            "node_name",
            "replica_id",
            "fencing_epoch",
            "checkpoint_interval_s",
            "interval_since",
            "nice",
            "batch_every_s",
        )
    )


def _upgrade_dict(upgrade: JobUpgrade) -> dict:
    return {
        "id": upgrade.pk,
        "requested_at": upgrade.requested_at,
        "requested_by": upgrade.requested_by.username if upgrade.requested_by else "",
        "from_topology": upgrade.from_topology,
        "to_topology": upgrade.to_topology,
        "from_params": dict(upgrade.from_params or {}),
        "to_params": dict(upgrade.to_params or {}),
        "from_strategy": upgrade.from_strategy,
        "to_strategy": upgrade.to_strategy,
        "mode": upgrade.mode,
        "case": upgrade.case,
        "reason": upgrade.reason,
        "status": upgrade.status,
        "status_label": upgrade.status_label,
        "under_way": upgrade.under_way,
        "requested_action": upgrade.requested_action,
        "stage": upgrade.stage,
        "blue_replica": upgrade.blue_replica,
        "green_replica": upgrade.green_replica,
        "checkpoint_batch": upgrade.checkpoint_batch,
        "result_preserving": upgrade.result_preserving,
        "results_compared": upgrade.results_compared,
        "results_differing": upgrade.results_differing,
        "switched_at": upgrade.switched_at,
        "ended_at": upgrade.ended_at,
        "ended_by": upgrade.ended_by.username if upgrade.ended_by else "",
        "outcome": upgrade.outcome,
        "gap_s": upgrade.gap_s,
        "lost": upgrade.lost,
        "duplicates": upgrade.duplicates,
    }


def upgrade_rows(job_id: int, limit: int = 30) -> list[dict]:
    """A job's upgrades, newest first, with who asked and who ended them, in one query.

    A job has at most one upgrade under way and it is its newest, so the rows also hold the
    one the job page's "upgrade in progress" panel shows.
    """
    upgrades = (
        JobUpgrade.objects.filter(job_id=job_id)
        .select_related("requested_by", "ended_by")
        .order_by("-requested_at", "-id")[:limit]
    )
    return [_upgrade_dict(upgrade) for upgrade in upgrades]


def topology_versions(topology: str) -> list[str]:
    """What a job running `topology` can be upgraded to: every registered version of its user
    job (`NAME@VERSION`, oldest first), or a built-in topology itself (only its operators'
    parameters change)."""
    name, separator, _ = topology.partition("@")
    if not separator:
        return [topology]
    versions = RegisteredTopology.objects.filter(name=name).order_by("version")
    return [f"{name}@{version}" for version in versions.values_list("version", flat=True)]


def upgrade_params_in_force(job_id: int) -> dict[str, str]:
    """The operator parameters a job runs with (those of its last confirmed upgrade)."""
    job = Job.objects.filter(pk=job_id).first()
    return current_upgrade_params(job) if job is not None else {}
