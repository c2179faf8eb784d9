"""Backstop's figures in the Prometheus text format, for `/metrics`.

Multi-process safe by construction: nothing is counted in process memory. Every scrape reads the
shared state the controller and the agents write (the database: jobs, operators, replicas,
metric samples, faults, episodes; Redis: the controller's last cycle per job, the Kafka lag and
source cause the stages publish), so whichever web worker answers, the figures are the same, and
counters are counts of stored rows (they only go down when rows are deleted by retention, which
Prometheus reads as a counter reset).

Names follow Prometheus conventions: the unit in the name (`_seconds`, `_bytes`, `_ratio`,
`_events_per_second`), `_total` for counters; labels are ids and names of jobs, stages,
operators, replicas and nodes (bounded by what runs), never record ids. `job_id` rather than
`job`, because Prometheus adds its own `job` label to every scraped series.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

from django.db.models import Count, FloatField, OuterRef, Q, Subquery, Sum
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from console.models import (
    Alert,
    AlertDelivery,
    FaultInjection,
    Job,
    MetricSample,
    Node,
    Operator,
    RecoveryEpisode,
    Replica,
)
from console.services import kafka_status
from console.services.control.observe import unsupervised_jobs
from console.services.control.record import reconcile_failures
from console.services.fleet import CONTROLLER_ALIVE_S, controller_stats
from infra import keys as control_keys
from infra.leases import live_controllers
from spark_runtime import keys as data_keys

# A controller that has not said it is alive within this many seconds is not counted.

# Bucket bounds (seconds) of the downtime and recovery-time histograms: from a promotion (about a
# second) to a cold restart that does not settle (a minute and more).
DURATION_BUCKETS_S = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)

# Metric-sample name -> (exported suffix, help) for a job (stage "") and for its stages.
JOB_SERIES = {
    "throughput_eps": ("throughput_events_per_second", "Events per second out of the job"),
    "input_rate_eps": ("input_rate_events_per_second", "Events per second into the job"),
}
LATENCY_QUANTILES = {"latency_p50_ms": "0.5", "latency_p90_ms": "0.9", "latency_p99_ms": "0.99"}
STAGE_SERIES = {
    "throughput_eps": ("throughput_events_per_second", "Events per second a stage processed"),
    "state_rows": ("state_rows", "Rows in a stage's state store"),
    "state_memory_bytes": ("state_memory_bytes", "Memory of a stage's state store"),
}
NODE_SERIES = {
    "cpu_util": ("cpu_utilisation_ratio", "Share of the node's CPU in use"),
    "mem_util": ("memory_utilisation_ratio", "Share of the node's memory in use"),
    "disk_util": ("disk_utilisation_ratio", "Share of the node's disk throughput in use"),
    "net_util": ("network_utilisation_ratio", "Share of the node's bandwidth in use"),
    "q_score": ("q_score", "Decayed resource score Q (Algorithm 1; higher is more idle)"),
    "warm_spares": ("warm_spares", "Idle pre-started stage processes on the node"),
}


def _newest(name: str, stage: str | None = None, **outer: str) -> Subquery:
    """The newest value of one metric for each row of an outer query (job, stage or node), as a
    correlated subquery: an indexed lookup per row inside the one query that lists the rows (the
    table holds days of samples, a scrape must not read them, nor make a query per job)."""
    rows = MetricSample.objects.filter(
        name=name, **{field: OuterRef(ref) for field, ref in outer.items()}
    )
    if stage is not None:
        rows = rows.filter(stage=stage)
    return Subquery(rows.order_by("-at").values("value")[:1], output_field=FloatField())


def _newest_of_jobs(job_ids: list[int], names) -> dict[int, dict[str, float | None]]:
    """job id -> metric name -> its newest job-level value, in one query."""
    rows = (
        Job.objects.filter(pk__in=job_ids)
        .annotate(**{name: _newest(name, stage="", job="pk") for name in names})
        .values("pk", *names)
    )
    return {row["pk"]: row for row in rows}


class BackstopCollector:
    """Reads the shared state at every scrape (see the module doc). `redis` may be None."""

    def __init__(self, redis=None):
        self.redis = redis

    def collect(self) -> Iterator[Metric]:
        live_jobs = list(Job.objects.filter(status__in=Job.LIVE_STATUSES).order_by("pk"))
        yield from self._jobs(live_jobs)
        yield from self._stages_and_operators(live_jobs)
        yield from self._replicas()
        yield from self._nodes()
        yield from self._faults_and_recoveries()
        yield from self._alerting()
        if self.redis is not None:
            yield from self._controller(live_jobs)
            yield from self._kafka(live_jobs)

    def _jobs(self, live_jobs: list[Job]) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "backstop_job_info",
            "A job (1): its name, topology, strategy and status",
            labels=["job_id", "name", "topology", "strategy", "status"],
        )
        for job in Job.objects.all():
            info.add_metric([str(job.pk), job.name, job.topology, job.strategy, job.status], 1)
        yield info
        up = GaugeMetricFamily("backstop_job_running", "1 while the job runs", labels=["job_id"])
        for job in Job.objects.exclude(status__in=(Job.Status.STOPPED, Job.Status.CREATED)):
            up.add_metric([str(job.pk)], 1.0 if job.status == Job.Status.RUNNING else 0.0)
        yield up
        newest = _newest_of_jobs([job.pk for job in live_jobs], [*JOB_SERIES, *LATENCY_QUANTILES])
        for metric, (suffix, doc) in JOB_SERIES.items():
            family = GaugeMetricFamily(f"backstop_job_{suffix}", doc, labels=["job_id"])
            for job in live_jobs:
                value = newest.get(job.pk, {}).get(metric)
                if value is not None:
                    family.add_metric([str(job.pk)], value)
            yield family
        latency = GaugeMetricFamily(
            "backstop_job_event_time_latency_seconds",
            "Event-time latency of the job's output, newest batch, by quantile",
            labels=["job_id", "quantile"],
        )
        for metric, quantile in LATENCY_QUANTILES.items():
            for job in live_jobs:
                value = newest.get(job.pk, {}).get(metric)
                if value is not None:
                    latency.add_metric([str(job.pk), quantile], value / 1000)
        yield latency

    def _stages_and_operators(self, live_jobs: list[Job]) -> Iterator[Metric]:
        ids = [job.pk for job in live_jobs]
        # Each operator row carries its stage's newest figures (one query); operators fused into
        # one stage carry the same ones.
        operators = list(
            Operator.objects.filter(job_id__in=ids)
            .annotate(
                **{
                    f"stage_{metric}": _newest(metric, job="job_id", stage=OuterRef("stage"))
                    for metric in STAGE_SERIES
                }
            )
            .order_by("job_id", "name")
        )
        stage_values = {
            (op.job_id, op.stage): {m: getattr(op, f"stage_{m}") for m in STAGE_SERIES}
            for op in operators
            if op.stage
        }
        for metric, (suffix, doc) in STAGE_SERIES.items():
            family = GaugeMetricFamily(f"backstop_stage_{suffix}", doc, labels=["job_id", "stage"])
            for (job_id, stage), values in sorted(stage_values.items()):
                if values[metric] is not None:
                    family.add_metric([str(job_id), stage], values[metric])
            yield family
        labels = ["job_id", "operator"]
        families = {
            "priority": GaugeMetricFamily(
                "backstop_operator_priority",
                "Effective priority P_eff of the operator",
                labels=labels,
            ),
            "active": GaugeMetricFamily(
                "backstop_operator_active",
                "1 when the operator has a hot standby",
                labels=labels,
            ),
            "interval": GaugeMetricFamily(
                "backstop_operator_checkpoint_interval_seconds",
                "Checkpoint interval the policy chose for the operator",
                labels=labels,
            ),
            "fault_rate": GaugeMetricFamily(
                "backstop_operator_predicted_fault_rate",
                "Fault rate fr used in the operator's priority",
                labels=labels,
            ),
        }
        for op in operators:
            key = [str(op.job_id), op.name]
            families["priority"].add_metric(key, op.priority)
            families["active"].add_metric(key, 1.0 if op.mode == Operator.Mode.ACTIVE else 0.0)
            families["interval"].add_metric(key, op.checkpoint_interval_s)
            families["fault_rate"].add_metric(key, op.predicted_fault_rate)
        yield from families.values()

    def _replicas(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "backstop_replica_info",
            "A live replica (1): its stage, role, node and state",
            labels=["job_id", "stage", "replica", "role", "node", "state"],
        )
        epoch = GaugeMetricFamily(
            "backstop_replica_fencing_epoch",
            "Fencing epoch of the replica's sink writes",
            labels=["job_id", "replica"],
        )
        live = Replica.objects.exclude(state__in=(Replica.State.STOPPED, Replica.State.FAILED))
        for replica in live.select_related("node").order_by("replica_id"):
            local_id = replica.replica_id.split("/", 1)[-1]
            job_id = str(replica.job_id)
            info.add_metric(
                [job_id, replica.stage, local_id, replica.role, replica.node.name, replica.state],
                1,
            )
            epoch.add_metric([job_id, local_id], replica.fencing_epoch)
        yield info
        yield epoch

    def _nodes(self) -> Iterator[Metric]:
        nodes = list(
            Node.objects.annotate(
                **{f"newest_{metric}": _newest(metric, node="pk") for metric in NODE_SERIES}
            ).order_by("name")
        )
        up = GaugeMetricFamily(
            "backstop_node_up", "1 while the node's agent reports", labels=["node"]
        )
        for node in nodes:
            up.add_metric([node.name], 1.0 if node.state == Node.State.UP else 0.0)
        yield up
        for metric, (suffix, doc) in NODE_SERIES.items():
            family = GaugeMetricFamily(f"backstop_node_{suffix}", doc, labels=["node"])
            for node in nodes:
                value = getattr(node, f"newest_{metric}")
                if value is not None:
                    family.add_metric([node.name], value)
            yield family

    def _alerting(self) -> Iterator[Metric]:
        """Open alerts by event and severity; deliveries by route, action and status (a
        `pending` count that grows means a receiver is down: docs/ALERTING.md)."""
        alerts = GaugeMetricFamily(
            "backstop_alerts_open",
            "Open alerts, by event and severity",
            labels=["event", "severity"],
        )
        open_alerts = Alert.objects.filter(state=Alert.State.OPEN).values("event", "severity")
        for row in open_alerts.annotate(n=Count("id")).order_by("event", "severity"):
            alerts.add_metric([row["event"], row["severity"]], row["n"])
        yield alerts
        deliveries = GaugeMetricFamily(
            "backstop_alert_deliveries",
            "Alert deliveries kept, by route, action and status",
            labels=["route", "action", "status"],
        )
        counted = AlertDelivery.objects.values("route__name", "action", "status")
        for row in counted.annotate(n=Count("id")).order_by("route__name", "action", "status"):
            deliveries.add_metric([row["route__name"], row["action"], row["status"]], row["n"])
        yield deliveries

    def _faults_and_recoveries(self) -> Iterator[Metric]:
        faults = CounterMetricFamily(
            "backstop_faults", "Faults asked for, by kind and outcome", labels=["kind", "outcome"]
        )
        counted = FaultInjection.objects.values("kind", "outcome").annotate(n=Count("id"))
        for row in counted.order_by("kind", "outcome"):
            faults.add_metric([row["kind"], row["outcome"]], row["n"])
        yield faults
        episodes = CounterMetricFamily(
            "backstop_recovery_episodes",
            "Recovery episodes, by strategy and the controller's action",
            labels=["strategy", "action"],
        )
        by_action = RecoveryEpisode.objects.values("strategy", "action").annotate(n=Count("id"))
        for row in by_action.order_by("strategy", "action"):
            episodes.add_metric([row["strategy"], row["action"]], row["n"])
        yield episodes
        yield from self._duration_histogram(
            "backstop_recovery_downtime_seconds", "Output gap of measured episodes", "downtime_s"
        )
        yield from self._duration_histogram(
            "backstop_recovery_time_seconds",
            "Time until throughput and latency were back in band, measured episodes",
            "recovery_time_s",
        )
        audit = RecoveryEpisode.objects.values("strategy").annotate(
            lost=Sum("lost"), duplicates=Sum("duplicates")
        )
        lost = CounterMetricFamily(
            "backstop_recovery_lost_results", "Results lost, audited episodes", labels=["strategy"]
        )
        duplicated = CounterMetricFamily(
            "backstop_recovery_duplicated_results",
            "Results duplicated, audited episodes",
            labels=["strategy"],
        )
        for row in audit.order_by("strategy"):
            lost.add_metric([row["strategy"]], row["lost"] or 0)
            duplicated.add_metric([row["strategy"]], row["duplicates"] or 0)
        yield lost
        yield duplicated

    def _duration_histogram(self, name: str, doc: str, field: str) -> Iterator[Metric]:
        """Counted in the database (one row per strategy), not by reading every episode."""
        family = HistogramMetricFamily(name, doc, labels=["strategy"])
        counts = {
            f"le_{index}": Count("id", filter=Q(**{f"{field}__lte": bound}))
            for index, bound in enumerate(DURATION_BUCKETS_S)
        }
        rows = (
            RecoveryEpisode.objects.filter(**{f"{field}__isnull": False})
            .order_by()
            .values("strategy")
            .annotate(n=Count("id"), total=Sum(field), **counts)
            .order_by("strategy")
        )
        for row in rows:
            buckets = [
                (str(bound), row[f"le_{index}"]) for index, bound in enumerate(DURATION_BUCKETS_S)
            ]
            buckets.append(("+Inf", row["n"]))
            family.add_metric([row["strategy"]], buckets, row["total"] or 0.0)
        yield family

    def _controller(self, live_jobs: list[Job]) -> Iterator[Metric]:
        duration = GaugeMetricFamily(
            "backstop_controller_cycle_duration_seconds",
            "How long the controller's last policy cycle of the job took",
            labels=["job_id"],
        )
        age = GaugeMetricFamily(
            "backstop_controller_cycle_age_seconds",
            "Seconds since the controller's last policy cycle of the job (its lag)",
            labels=["job_id"],
        )
        now = time.time()
        keys = [control_keys.controller_cycle(job.key) for job in live_jobs]
        cycles = self.redis.mget(keys) if keys else []  # one round trip for the fleet
        for job, raw in zip(live_jobs, cycles, strict=True):
            if raw is None:
                continue
            cycle = json.loads(raw)
            duration.add_metric([str(job.pk)], cycle["duration_s"])
            age.add_metric([str(job.pk)], max(0.0, now - cycle["at"]))
        yield duration
        yield age
        controllers = GaugeMetricFamily(
            "backstop_controllers",
            f"Live controller processes (said they are alive within {CONTROLLER_ALIVE_S:g} s)",
        )
        controllers.add_metric([], len(live_controllers(self.redis, CONTROLLER_ALIVE_S)))
        yield controllers
        unsupervised = GaugeMetricFamily(
            "backstop_jobs_unsupervised",
            "Live jobs whose supervision lease no controller holds (0 while controllers run)",
        )
        unsupervised.add_metric([], len(unsupervised_jobs(self.redis)))
        yield unsupervised
        yield from self._work_queues()
        failing = GaugeMetricFamily(
            "backstop_job_reconcile_failures",
            "Reconciles of the job that failed in a row, while they fail (the controller "
            "retries it with a growing delay; the last error is on the job page)",
            labels=["job_id"],
        )
        failures = reconcile_failures(self.redis, [job.key for job in live_jobs])
        for job in live_jobs:
            if job.key in failures:
                failing.add_metric([str(job.pk)], failures[job.key].get("failures", 0))
        yield failing

    def _work_queues(self) -> Iterator[Metric]:
        """Each live controller's work queue, as it published it at its last renewal."""
        labels = ["controller"]
        depth = GaugeMetricFamily(
            "backstop_controller_queue_depth",
            "Jobs queued in the controller's work queue (due now or later)",
            labels=labels,
        )
        held = GaugeMetricFamily(
            "backstop_controller_jobs", "Jobs the controller supervises", labels=labels
        )
        failing = GaugeMetricFamily(
            "backstop_controller_jobs_failing",
            "Jobs of the controller whose last reconcile failed (retried with backoff)",
            labels=labels,
        )
        errors = CounterMetricFamily(
            "backstop_controller_reconcile_errors",
            "Reconciles that raised, since the controller started",
            labels=labels,
        )
        membership = CounterMetricFamily(
            "backstop_controller_membership_errors",
            "Membership rounds (leases, fair share, fleet view) that raised",
            labels=labels,
        )
        latency = SummaryMetricFamily(
            "backstop_controller_reconcile_duration_seconds",
            "How long the controller's reconciles took, since it started",
            labels=labels,
        )
        for owner, figures in sorted(controller_stats(self.redis).items()):
            depth.add_metric([owner], figures.get("queue_depth", 0.0))
            held.add_metric([owner], figures.get("held", 0.0))
            failing.add_metric([owner], figures.get("failing", 0.0))
            errors.add_metric([owner], figures.get("reconcile_errors", 0.0))
            membership.add_metric([owner], figures.get("membership_errors", 0.0))
            latency.add_metric(
                [owner],
                count_value=figures.get("reconciles", 0.0),
                sum_value=figures.get("reconcile_seconds", 0.0),
            )
        yield from (depth, held, failing, errors, membership, latency)
        yield GaugeMetricFamily(
            "backstop_refused_commands",
            "Controller commands agents and stages refused because their sender no longer held "
            f"the job's lease (the newest {data_keys.REFUSED_COMMANDS_MAXLEN:,} kept)",
            value=self.redis.xlen(data_keys.refused_commands()),
        )

    def _kafka(self, live_jobs: list[Job]) -> Iterator[Metric]:
        """The live jobs reading Kafka: each partition's lag as the stage's primary last
        published it (kafka_status), and whether the source reads. One query and two Redis
        round trips for the fleet; nothing when no job reads Kafka."""
        lag = GaugeMetricFamily(
            "backstop_kafka_lag_records",
            "Records of a partition of the job's Kafka input the stage's primary has not read "
            "(end offset - offset read, as it last published them)",
            labels=["job_id", "name", "stage", "partition"],
        )
        source_ok = GaugeMetricFamily(
            "backstop_kafka_source_ok",
            "1 while the job's Kafka source reads, 0 while it cannot (broker down, topic "
            "missing: the cause is on the job page)",
            labels=["job_id", "name"],
        )
        kafka_jobs = kafka_status.kafka_jobs(live_jobs)
        lags = kafka_status.read_primary_lags(self.redis, kafka_jobs)
        causes = kafka_status.read_source_causes(self.redis, kafka_jobs)
        for job in live_jobs:
            if job.pk not in causes:
                continue
            source_ok.add_metric([str(job.pk), job.name], 0.0 if causes[job.pk] else 1.0)
            for entry in lags.get(job.pk, []):
                for partition in entry.partitions:
                    labels = [str(job.pk), job.name, entry.stage, str(partition.partition)]
                    lag.add_metric(labels, partition.lag)
        yield lag
        yield source_ok


def exposition(redis=None) -> bytes:
    """The text a scrape gets."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BackstopCollector(redis))
    return generate_latest(registry)
