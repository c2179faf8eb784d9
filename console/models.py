"""Backstop's domain model: nodes, jobs and their operators, replicas, faults, recoveries, metrics
and the versioned fault-tolerance policy."""

from __future__ import annotations

import json
import uuid
from dataclasses import fields as dataclass_fields
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import models, transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from console.policy.config import BOUNDS, PolicyConfig, PolicyConfigError
from spark_runtime.strategies import STRATEGY_TABLE
from spark_runtime.topology import OPERATOR_KINDS


class InvalidTransition(Exception):
    """A status change that the lifecycle does not allow (e.g. stopped -> running)."""


class Node(models.Model):
    """A host running a node agent; replicas of stages are placed on nodes.

    Capacities are what the node offers Backstop (cores, MiB, MB/s); live usage arrives as
    MetricSample rows from the node agent, and `last_heartbeat` tells the controller it is alive.
    """

    class State(models.TextChoices):
        UP = "up", "up"
        DOWN = "down", "down"
        DRAINING = "draining", "draining"
        UNKNOWN = "unknown", "unknown"

    name = models.SlugField(max_length=64, unique=True)
    cpu_total = models.FloatField(help_text="Cores offered to Backstop.")
    mem_total_mb = models.FloatField(help_text="Memory offered to Backstop, MiB.")
    disk_max_mbps = models.FloatField(default=200.0, help_text="Disk throughput ceiling, MB/s.")
    bw_total_mbps = models.FloatField(default=1000.0, help_text="Network bandwidth, Mbit/s.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.UNKNOWN)
    last_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @property
    def queue(self) -> str:
        """The Celery queue of this node's agent."""
        from workers.queues import node_queue

        return node_queue(self.name)

    def record_heartbeat(self, at=None) -> None:
        """Mark the node alive now (or at `at`)."""
        self.last_heartbeat = at or timezone.now()
        self.state = self.State.UP
        self.save(update_fields=["last_heartbeat", "state"])


class Job(models.Model):
    """A streaming job: one topology run with one fault-tolerance strategy.

    Status moves created -> starting -> running -> stopping -> stopped, with failed reachable from
    any live state. Transition methods are idempotent: asking for the state the job is already in
    does nothing, so a retried Celery task cannot corrupt the lifecycle.
    """

    class Status(models.TextChoices):
        CREATED = "created", "created"
        STARTING = "starting", "starting"
        RUNNING = "running", "running"
        STOPPING = "stopping", "stopping"
        STOPPED = "stopped", "stopped"
        FAILED = "failed", "failed"

    # One member per entry of spark_runtime.strategies (RESTART_ALL, LOCAL_RESTART, ...).
    Strategy = models.TextChoices(
        "Strategy",
        [(s.name.upper().replace("-", "_"), (s.name, s.label)) for s in STRATEGY_TABLE.values()],
    )

    # Allowed moves; the key is the target status, the value the statuses it may be reached from.
    TRANSITIONS = {
        Status.STARTING: {Status.CREATED, Status.STOPPED, Status.FAILED},
        Status.RUNNING: {Status.STARTING},
        Status.STOPPING: {Status.CREATED, Status.STARTING, Status.RUNNING},
        Status.STOPPED: {Status.STOPPING},
        Status.FAILED: {Status.CREATED, Status.STARTING, Status.RUNNING, Status.STOPPING},
    }
    LIVE_STATUSES = (Status.STARTING, Status.RUNNING, Status.STOPPING)

    name = models.CharField(max_length=100)
    key = models.SlugField(
        max_length=40,
        unique=True,
        editable=False,
        help_text="Identifier used in Redis keys (backstop:{key}:...); unique across resets.",
    )
    topology = models.CharField(
        max_length=48,
        help_text="A built-in topology, or NAME@VERSION of a registered user job (the version "
        "the job started with: it keeps it when a newer one is registered).",
    )
    strategy = models.CharField(max_length=20, choices=Strategy.choices, default=Strategy.ADAPTIVE)
    params = models.JSONField(default=dict, blank=True, help_text="e.g. {'rate': 500}")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CREATED)
    status_reason = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self):
        return f"{self.name} ({self.topology}, {self.strategy})"

    def save(self, *args, **kwargs):
        if not self.key:
            self.key = f"job-{uuid.uuid4().hex[:12]}"
        super().save(*args, **kwargs)

    @property
    def is_live(self) -> bool:
        return self.status in self.LIVE_STATUSES

    def transition(self, target: str, reason: str = "") -> bool:
        """Move to `target`; False when already there; InvalidTransition when not allowed.

        The row is locked while deciding so two workers cannot race the same job.
        """
        with transaction.atomic():
            locked = Job.objects.select_for_update().get(pk=self.pk)
            if locked.status == target:
                self.status = locked.status
                return False
            if locked.status not in self.TRANSITIONS[target]:
                raise InvalidTransition(
                    f"job {self.pk}: cannot go from {locked.status} to {target}"
                )
            locked.status = target
            locked.status_reason = reason
            now = timezone.now()
            if target == self.Status.RUNNING:
                locked.started_at = now
            if target in (self.Status.STOPPED, self.Status.FAILED):
                locked.stopped_at = now
            if target == self.Status.STARTING:
                locked.stopped_at = None
            locked.save(update_fields=["status", "status_reason", "started_at", "stopped_at"])
        self.refresh_from_db(fields=["status", "status_reason", "started_at", "stopped_at"])
        return True

    def mark_starting(self, reason: str = "") -> bool:
        return self.transition(self.Status.STARTING, reason)

    def mark_running(self, reason: str = "") -> bool:
        return self.transition(self.Status.RUNNING, reason)

    def request_stop(self, reason: str = "") -> bool:
        """Ask the job to stop; a job that is already stopping or stopped is left alone."""
        if self.status in (self.Status.STOPPED, self.Status.FAILED):
            return False
        return self.transition(self.Status.STOPPING, reason)

    def mark_stopped(self, reason: str = "") -> bool:
        return self.transition(self.Status.STOPPED, reason)

    def mark_failed(self, reason: str) -> bool:
        return self.transition(self.Status.FAILED, reason)


class Operator(models.Model):
    """One operator of a job's topology with its current fault-tolerance assessment.

    S, R, L and P are the Da-Stream type score, resource score, dependency strength and priority;
    `mode` says whether it gets a hot standby (active) or relies on checkpoints (passive).
    """

    class Mode(models.TextChoices):
        ACTIVE = "active", "active (hot standby)"
        PASSIVE = "passive", "passive (checkpoint)"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="operators")
    name = models.CharField(max_length=64)
    kind = models.CharField(max_length=32, choices=[(k, k) for k in OPERATOR_KINDS])
    stage = models.CharField(max_length=64, blank=True, help_text="Stage (query) running it.")
    upstream = models.JSONField(default=list, blank=True)
    downstream = models.JSONField(default=list, blank=True)
    cpu_demand = models.FloatField(default=0.25, help_text="Cores.")
    mem_demand_mb = models.FloatField(default=256.0, help_text="MiB.")
    demand_source = models.CharField(
        max_length=16,
        default="estimated",
        help_text="Where the demand comes from: the estimate until its stage runs, then measured.",
    )
    type_score = models.FloatField(default=0.0, help_text="S")
    resource_score = models.FloatField(default=0.0, help_text="R")
    dependency_score = models.FloatField(default=0.0, help_text="L")
    priority = models.FloatField(default=0.0, help_text="P = w1*S + w2*R + w3*L (+ fault risk)")
    predicted_fault_rate = models.FloatField(default=0.0, help_text="fr")
    fault_rate_source = models.CharField(
        max_length=200, blank=True, help_text="Where fr came from: a trained model or the prior."
    )
    mode = models.CharField(max_length=10, choices=Mode.choices, default=Mode.PASSIVE)
    checkpoint_interval_s = models.FloatField(default=5.0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["job", "id"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="operator_unique_name")]

    def __str__(self):
        return f"{self.job.name}/{self.name}"


class Replica(models.Model):
    """A process running one stage of a job on a node, as primary or hot standby.

    `fencing_epoch` is the epoch the replica writes with; the sink refuses writes from an epoch
    older than the stage's current one, so a stale primary can never write after a promotion.
    """

    class Role(models.TextChoices):
        PRIMARY = "primary", "primary"
        STANDBY = "standby", "standby"

    class State(models.TextChoices):
        STARTING = "starting", "starting"
        RUNNING = "running", "running"
        CATCHING_UP = "catching_up", "catching up (standby too far behind to take over)"
        SLOW = "slow", "slow (no heartbeat, but its process is busy)"
        BACKOFF = "backoff", "waiting to restart (it keeps failing before its first batch)"
        PROMOTING = "promoting", "promoting"
        STOPPED = "stopped", "stopped"
        FAILED = "failed", "failed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="replicas")
    replica_id = models.CharField(max_length=100, unique=True)
    stage = models.CharField(max_length=64)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="replicas")
    role = models.CharField(max_length=10, choices=Role.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    pid = models.IntegerField(null=True, blank=True)
    fencing_epoch = models.PositiveIntegerField(default=0)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    checkpoint_interval_s = models.FloatField(
        null=True, blank=True, help_text="The checkpoint interval in force, as the replica reports."
    )
    interval_since = models.DateTimeField(null=True, blank=True, help_text="In force since.")
    nice = models.IntegerField(
        null=True,
        blank=True,
        help_text="Its CPU priority as it reports it (nice level: lower runs first; "
        "spark_runtime/strategies.py has the levels).",
    )
    batch_every_s = models.FloatField(
        null=True,
        blank=True,
        help_text="A caught-up standby's pace: it reads new input every this many seconds "
        "(empty: on every trigger).",
    )
    # A standby's latest StandbyVerdict from the policy (console/policy/placement.py): the rule
    # that placed, moved or kept it there, with its Q figures and the reserve check, and "at"
    # (ISO time). Written at launch and by every policy cycle that may move standbys.
    placement = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["job", "stage", "role"]

    def __str__(self):
        return f"{self.replica_id} ({self.role} on {self.node.name})"

    @staticmethod
    def full_id(job_key: str, local_id: str) -> str:
        """The stored `replica_id` of the replica the data plane calls `local_id` in `job_key`
        (replica ids are unique per job there, and across jobs here)."""
        return f"{job_key}/{local_id}"

    @property
    def local_id(self) -> str:
        """The replica's id in the data plane (its Redis entries, its agent's process list)."""
        return self.replica_id.split("/", 1)[1]


class FaultInjection(models.Model):
    """A fault asked for by a person or a schedule, and what came of it."""

    class Kind(models.TextChoices):
        KILL_DRIVER = "kill-driver", "kill a stage's primary process and its JVM"
        KILL_STANDBY = "kill-standby", "kill a stage's hot standby"
        KILL_NODE = "kill-node", "kill every replica on a node"
        PAUSE_NODE = "pause-node", "SIGSTOP a node's replicas for N seconds"
        OPERATOR_EXCEPTION = "operator-exception", "the operator raises on its next batch"
        STRESS_NODE = "stress-node", "CPU hog on a node for N seconds"
        KILL_EXECUTOR = "kill-executor", "kill one Spark executor of a stage's primary"
        KILL_WORKER = "kill-worker", "kill the Spark worker running a primary's executor"

    class Outcome(models.TextChoices):
        PENDING = "pending", "pending"
        INJECTED = "injected", "injected"
        FAILED = "failed", "failed"
        REFUSED = "refused", "refused"

    NODE_KINDS = (Kind.KILL_NODE, Kind.PAUSE_NODE, Kind.STRESS_NODE)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="faults")
    kind = models.CharField(max_length=24, choices=Kind.choices)
    target_operator = models.CharField(max_length=64, blank=True)
    target_node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL)
    params = models.JSONField(default=dict, blank=True, help_text="e.g. {'duration_s': 10}")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        help_text="Empty when a schedule asked.",
    )
    requested_at = models.DateTimeField(auto_now_add=True)
    injected_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.PENDING)
    outcome_detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at"]

    def __str__(self):
        target = self.target_operator or (self.target_node and self.target_node.name) or "?"
        return f"{self.kind} on {target} ({self.outcome})"


class RecoveryEpisode(models.Model):
    """One failure and the recovery from it, measured by the recovery detector.

    Downtime is the gap in output; recovery time is downtime plus catch-up until latency is back
    within the band; lost and duplicates compare input ids with output ids.
    """

    class Action(models.TextChoices):
        PROMOTE = "promote", "promoted the standby"
        RESTART_STAGE = "restart-stage", "restarted the stage from its checkpoint"
        RESTART_JOB = "restart-job", "restarted the whole job"
        # A lost executor or worker: the stage's process lives on and Spark runs the lost tasks
        # again on its other executors; Backstop only measures the episode.
        SPARK_RETRY = "spark-retry", "Spark ran the lost tasks again"
        NONE = "none", "no action needed"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="recoveries")
    fault = models.ForeignKey(
        FaultInjection, null=True, blank=True, on_delete=models.SET_NULL, related_name="episodes"
    )
    strategy = models.CharField(max_length=20, choices=Job.Strategy.choices)
    stage = models.CharField(max_length=64, blank=True)
    action = models.CharField(max_length=16, choices=Action.choices, default=Action.NONE)
    detected_at = models.DateTimeField()
    recovered_at = models.DateTimeField(null=True, blank=True)
    downtime_s = models.FloatField(null=True, blank=True)
    recovery_time_s = models.FloatField(null=True, blank=True)
    peak_p99_ms = models.FloatField(null=True, blank=True)
    # After a promotion: seconds until the stage again had a promotable (caught-up) standby.
    reprotect_s = models.FloatField(null=True, blank=True)
    # Seconds after the fault its output was judged; set when the figures are final (an episode
    # without it is still being measured). Unrecovered: the recovery took longer than this.
    watched_s = models.FloatField(null=True, blank=True)
    # Where "normal" was learned for this fault (the next fault may be judged against it too).
    reference_from = models.DateTimeField(null=True, blank=True)
    reference_to = models.DateTimeField(null=True, blank=True)
    lost = models.IntegerField(null=True, blank=True)
    duplicates = models.IntegerField(null=True, blank=True)
    notes = models.TextField(blank=True)

    class Meta:
        ordering = ["-detected_at"]

    def __str__(self):
        return f"{self.job.name} {self.stage} @ {self.detected_at:%Y-%m-%d %H:%M:%S}"


class MetricSampleQuerySet(models.QuerySet):
    def older_than(self, hours: float):
        return self.filter(at__lt=timezone.now() - timedelta(hours=hours))


class MetricSample(models.Model):
    """One measurement at one time, for a job (optionally one stage/operator) or a node.

    Stored long-form (name, value) so new metrics need no migration; the indexes serve the two
    queries the console makes: one metric of one job over time, one metric of one node over time.
    """

    at = models.DateTimeField(db_index=True)
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="metrics"
    )
    stage = models.CharField(max_length=64, blank=True)
    node = models.ForeignKey(
        Node, null=True, blank=True, on_delete=models.CASCADE, related_name="metrics"
    )
    name = models.CharField(max_length=48, help_text="e.g. throughput_eps, latency_p99_ms")
    value = models.FloatField()

    objects = MetricSampleQuerySet.as_manager()

    class Meta:
        ordering = ["at"]
        indexes = [
            models.Index(fields=["job", "name", "at"], name="metric_job_name_at"),
            models.Index(fields=["node", "name", "at"], name="metric_node_name_at"),
        ]

    def __str__(self):
        return f"{self.name}={self.value} @ {self.at:%H:%M:%S}"


class RegisteredTopology(models.Model):
    """One registered version of a user job (spark_runtime/jobdef.py, docs/JOBS.md).

    Registration checks the module against the contract and dry-runs it on a local Spark session,
    then keeps a snapshot of its source (`source`, also written under the jobs directory's
    `.registered/` for the stage processes). Versions are never edited: registering a changed
    module writes the next version, with who and when, so the history is the audit trail; a job
    runs the version it was started with (`Job.topology` = `NAME@VERSION`).
    """

    name = models.CharField(max_length=32)
    version = models.PositiveIntegerField()
    module = models.CharField(max_length=200, help_text="package.module:attribute in the jobs dir")
    source = models.TextField(help_text="The registered snapshot of the module")
    source_sha256 = models.CharField(max_length=64)
    description = models.CharField(max_length=300, blank=True)
    shape = models.JSONField(
        default=dict,
        help_text="What the check found: operators, input fields, output, output columns",
    )
    registered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    registered_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="unique_topology_version")
        ]
        verbose_name_plural = "registered topologies"

    def __str__(self):
        return self.ident

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValidationError("registered versions are immutable; register a new version")
        super().save(*args, **kwargs)

    @property
    def ident(self) -> str:
        """The topology name a job of this version runs as: `NAME@VERSION`."""
        return f"{self.name}@{self.version}"


class Policy(models.Model):
    """One version of the fault-tolerance thresholds and weights (Da-Stream's knobs).

    Versions are never edited in place: every change writes a new row with who, when and why, so
    the history is the audit trail and any version can be restored. The newest row is in force.
    The tunable fields are not written here: they are PolicyConfig's (console.policy.config),
    with its names, types and defaults and each bound's reason as the help text, added to the
    model by `_mirror_policy_config` below; PolicyConfig.validate() checks them.
    """

    version = models.PositiveIntegerField(unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    reason = models.CharField(max_length=300, blank=True)

    # One field per PolicyConfig field, added below the class (`_mirror_policy_config`).

    class Meta:
        ordering = ["-version"]
        verbose_name_plural = "policies"

    def __str__(self):
        return f"policy v{self.version}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValidationError("policy versions are immutable; create a new version instead")
        if not self.version:
            latest = Policy.objects.order_by("-version").values_list("version", flat=True).first()
            self.version = (latest or 0) + 1
        super().save(*args, **kwargs)

    @staticmethod
    def threshold_field_names() -> list[str]:
        """The tunable fields, in PolicyConfig's order."""
        return list(PolicyConfig.__dataclass_fields__)

    def to_config(self) -> PolicyConfig:
        """The pure-Python config the policy code works with."""
        return PolicyConfig(**{name: getattr(self, name) for name in self.threshold_field_names()})

    def clean(self):
        """Validate through PolicyConfig so the API, admin and console share one set of rules."""
        try:
            self.to_config().validate()
        except PolicyConfigError as exc:
            raise ValidationError(exc.errors) from exc

    @staticmethod
    def diff(older: Policy | None, newer: Policy) -> dict[str, list]:
        """`{field: [old, new]}` for each threshold that differs between two versions.

        With no older version (the first one) there is nothing to compare with: an empty dict.
        """
        if older is None:
            return {}
        changes = {}
        for name in Policy.threshold_field_names():
            old, new = getattr(older, name), getattr(newer, name)
            if old != new:
                changes[name] = [old, new]
        return changes

    def previous(self) -> Policy | None:
        """The version this one replaced, or None for the first version."""
        return Policy.objects.filter(version__lt=self.version).order_by("-version").first()

    def changes_from_previous(self) -> dict[str, list]:
        """What this version changed: `{field: [old, new]}` compared with the previous version."""
        return Policy.diff(self.previous(), self)

    @classmethod
    def current(cls) -> Policy:
        """The version in force: the newest row, created with defaults if there is none."""
        latest = cls.objects.order_by("-version").first()
        if latest is None:
            latest = cls(reason="defaults")
            latest.save()
        return latest


def _mirror_policy_config() -> None:
    """Add one model field per PolicyConfig field (same name, type and default), so the model
    and the validated config cannot drift apart; a new tunable is one edit in PolicyConfig (and
    BOUNDS) plus a migration."""
    for config_field in dataclass_fields(PolicyConfig):
        help_text = BOUNDS[config_field.name].why
        if config_field.type == "int":
            field = models.PositiveIntegerField(default=config_field.default, help_text=help_text)
        else:
            field = models.FloatField(default=config_field.default, help_text=help_text)
        Policy.add_to_class(config_field.name, field)


_mirror_policy_config()


class ControlDecision(models.Model):
    """Something the controller decided or saw, with the reason, for the console and the audit.

    Policy actions (add/drop/move standby, set interval), recovery actions (promote, restart) and
    failures (with the tail of the failed stage's log in `detail["error_tail"]`) all land here.
    """

    class Kind(models.TextChoices):
        ADD_STANDBY = "add-standby", "add standby"
        DROP_STANDBY = "drop-standby", "drop standby"
        MOVE_STANDBY = "move-standby", "move standby"
        SET_INTERVAL = "set-interval", "set checkpoint interval"
        PROMOTE = "promote", "promote standby"
        RESTART_STAGE = "restart-stage", "restart stage"
        RESTART_JOB = "restart-job", "restart job"
        FAILURE = "failure", "failure"
        FAULT = "fault", "fault injected"
        GIVE_UP = "give-up", "gave up"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="decisions")
    at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    operator = models.CharField(max_length=64, blank=True)
    stage = models.CharField(max_length=64, blank=True)
    node = models.CharField(max_length=64, blank=True)
    replica_id = models.CharField(max_length=100, blank=True)
    reason = models.TextField(blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["job", "-at"], name="decision_job_at")]

    def __str__(self):
        return f"{self.kind} {self.stage or self.operator} @ {self.at:%H:%M:%S}"


class PredictorTraining(models.Model):
    """One training run of the fault predictor (console/policy/prediction.py) on recorded history.

    The newest run decides: if it is `used`, its coefficients give every stage's fr in the policy
    cycles that follow; if not (too little history, or worse than the prior on held-out data),
    every operator gets the prior and `reason` says why.
    """

    trained_at = models.DateTimeField(default=timezone.now, db_index=True)
    window_s = models.FloatField(help_text="The window one row describes and fr refers to.")
    history_s = models.FloatField(help_text="How far back the rows reach.")
    samples = models.PositiveIntegerField(help_text="Rows: one per stage and window.")
    failures = models.PositiveIntegerField(help_text="Rows whose stage failed in the next window.")
    holdout_samples = models.PositiveIntegerField(default=0)
    features = models.JSONField(default=list)
    prior = models.FloatField(help_text="The fault_rate_prior the model is compared with.")
    r2 = models.FloatField(null=True, blank=True, help_text="R^2 on held-out rows.")
    mae = models.FloatField(null=True, blank=True, help_text="Mean absolute error, held out.")
    prior_mae = models.FloatField(null=True, blank=True)
    mse = models.FloatField(null=True, blank=True, help_text="Mean squared error, held out.")
    prior_mse = models.FloatField(null=True, blank=True)
    used = models.BooleanField(default=False)
    reason = models.TextField(blank=True)
    predictor = models.JSONField(default=dict, help_text="FaultPredictor.to_dict()")

    class Meta:
        ordering = ["-trained_at"]

    def __str__(self):
        verdict = "used" if self.used else "not used"
        return f"predictor #{self.pk} @ {self.trained_at:%Y-%m-%d %H:%M} ({verdict})"


def split_recipients(raw: str) -> list[str]:
    """The addresses of a comma-separated recipients list, blanks dropped."""
    return [part.strip() for part in (raw or "").split(",") if part.strip()]


def validate_recipients(raw: str) -> None:
    """At least one address, each a valid email address; the message names the bad one."""
    addresses = split_recipients(raw)
    if not addresses:
        raise ValidationError("recipients: give at least one email address")
    for address in addresses:
        try:
            validate_email(address)
        except ValidationError:
            raise ValidationError(f"recipients: {address!r} is not a valid email address") from None


def default_report_crontab() -> CrontabSchedule:
    """Every day at 07:00 UTC: the schedule a new subscription starts with."""
    crontab, _ = CrontabSchedule.objects.get_or_create(
        minute="0",
        hour="7",
        day_of_week="*",
        day_of_month="*",
        month_of_year="*",
        timezone="UTC",
    )
    return crontab


class ReportSubscription(models.Model):
    """Who receives the periodic report and the alerts, about which jobs, and when.

    The crontab says when the report is sent; `period_hours` says how far back it looks. Saving
    the subscription creates or updates its django-celery-beat PeriodicTask (task
    `backstop.send_report`, kwargs `{"subscription_id": id}`), so beat picks up changes without a
    restart and the crontab stays editable in the admin. Alerts go to the same recipients when a
    recovery takes longer than `alert_recovery_over_s` or a job fails for good.
    """

    REPORT_TASK = "backstop.send_report"

    class Scope(models.TextChoices):
        ALL = "all", "all jobs"
        SELECTED = "selected", "selected jobs"

    name = models.CharField(max_length=100, unique=True)
    recipients = models.TextField(
        validators=[validate_recipients], help_text="Comma-separated email addresses."
    )
    scope = models.CharField(max_length=10, choices=Scope.choices, default=Scope.ALL)
    jobs = models.ManyToManyField(
        Job,
        blank=True,
        related_name="report_subscriptions",
        help_text="Used when scope is selected.",
    )
    period_hours = models.PositiveIntegerField(
        default=24, help_text="The report covers this many hours before it is sent."
    )
    crontab = models.ForeignKey(
        CrontabSchedule,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        help_text="When the report is sent; empty means every day at 07:00 UTC.",
    )
    periodic_task = models.OneToOneField(
        PeriodicTask, null=True, blank=True, editable=False, on_delete=models.SET_NULL
    )
    enabled = models.BooleanField(default=True)
    alert_recovery_over_s = models.FloatField(
        null=True,
        blank=True,
        help_text="Email an alert when a recovery takes longer than this (seconds); empty: never.",
    )
    alert_on_job_failure = models.BooleanField(
        default=False, help_text="Email an alert when a job fails for good."
    )
    last_sent_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    @transaction.atomic
    def save(self, *args, **kwargs):
        self.recipients = ", ".join(self.recipient_list())
        if self.crontab_id is None:
            self.crontab = default_report_crontab()
        super().save(*args, **kwargs)
        self.sync_periodic_task()

    def clean(self):
        if self.period_hours is not None and self.period_hours < 1:
            raise ValidationError({"period_hours": "period_hours: must be at least 1"})
        if self.alert_recovery_over_s is not None and self.alert_recovery_over_s <= 0:
            raise ValidationError(
                {"alert_recovery_over_s": "alert_recovery_over_s: must be > 0 (or empty)"}
            )

    def recipient_list(self) -> list[str]:
        return split_recipients(self.recipients)

    def job_queryset(self):
        """The jobs the subscription is about."""
        if self.scope == self.Scope.ALL:
            return Job.objects.all()
        return self.jobs.all()

    def covers(self, job: Job) -> bool:
        """True when `job` is in the subscription's scope."""
        return self.scope == self.Scope.ALL or self.jobs.filter(pk=job.pk).exists()

    def sync_periodic_task(self) -> PeriodicTask:
        """Create or update the beat entry that sends this report (its name carries the id)."""
        values = {
            "name": f"backstop report #{self.pk}: {self.name}"[:200],
            "task": self.REPORT_TASK,
            "crontab": self.crontab,
            "interval": None,
            "kwargs": json.dumps({"subscription_id": self.pk}),
            "queue": "control",
            "enabled": self.enabled,
            "description": f"Sends the '{self.name}' report (managed by the subscription).",
        }
        task = self.periodic_task
        if task is None:
            task = PeriodicTask.objects.create(**values)
            type(self).objects.filter(pk=self.pk).update(periodic_task=task)
            self.periodic_task = task
        else:
            for field, value in values.items():
                setattr(task, field, value)
            task.save()
        return task


@receiver(post_delete, sender=ReportSubscription, dispatch_uid="backstop.delete_report_task")
def _delete_report_task(sender, instance, **kwargs):
    """A deleted subscription takes its beat entry with it (also for bulk deletes)."""
    if instance.periodic_task_id:
        PeriodicTask.objects.filter(pk=instance.periodic_task_id).delete()


class SentAlert(models.Model):
    """An alert already emailed to a subscription, so the same event is never alerted twice.

    `key` names the event: `recovery:<episode id>` or `job-failed:<job id>:<failure time>`.
    """

    subscription = models.ForeignKey(
        ReportSubscription, on_delete=models.CASCADE, related_name="sent_alerts"
    )
    key = models.CharField(max_length=120)
    subject = models.CharField(max_length=200)
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-sent_at"]
        constraints = [
            models.UniqueConstraint(fields=["subscription", "key"], name="sent_alert_unique_key")
        ]

    def __str__(self):
        return f"{self.key} -> {self.subscription.name}"
