"""Jobs: a job's lifecycle, the operators of its topology and the registered user topologies
it may run."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.utils import timezone

from console.models.teams import Team
from spark_runtime.strategies import STRATEGY_TABLE
from spark_runtime.topology import OPERATOR_KINDS


class InvalidTransition(Exception):
    """A status change that the lifecycle does not allow (e.g. stopped -> running)."""


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
    args = models.JSONField(
        default=list,
        blank=True,
        help_text="An app's sys.argv[1:] (a registered app only), e.g. ['--in', '/data/in']",
    )
    # Where the job reads and writes outside its own Redis streams (spark_runtime/external_io):
    # {} for its own input stream and results hash only.
    source = models.JSONField(
        default=dict,
        blank=True,
        help_text="{} (the job's own input stream) or {'kind': 'kafka', 'topic': ..., "
        "'starting_offsets', 'event_time', 'max_records_per_trigger', 'accept_loss'}",
    )
    sink = models.JSONField(
        default=dict,
        blank=True,
        help_text="{} (results in Redis only) or {'kind': 'kafka', 'topic': ...}: results also "
        "go to the topic, exactly once",
    )

    class Trigger(models.TextChoices):
        MICROBATCH = "microbatch", "micro-batch"
        REALTIME = "realtime", "real-time mode"

    trigger = models.CharField(max_length=12, choices=Trigger.choices, default=Trigger.MICROBATCH)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.CREATED)
    status_reason = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    # Who owns the job: viewers and operators of other teams do not see it (admins see all).
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
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

    @classmethod
    def from_spec(cls, job: Job, spec, topology, stage: str = "") -> Operator:
        """The (unsaved) row of operator `spec` (a spark_runtime.topology.OperatorSpec) of
        `topology`: how a job's operators come to be, declared by a topology or found in a
        running app's plans (console/services/app_operators.py)."""
        return cls(
            job=job,
            name=spec.name,
            kind=spec.kind,
            stage=stage,
            upstream=list(spec.upstream),
            downstream=list(topology.downstream(spec.name)),
            cpu_demand=spec.cpu,
            mem_demand_mb=spec.mem,
        )


class RegisteredTopology(models.Model):
    """One registered version of a user job (spark_runtime/jobdef.py, docs/JOBS.md): a job
    module written to the contract (`module`), or an existing app run as it is (`app`,
    spark_runtime/apps.py: checked to compile and import, not dry-run).

    Registration checks the module against the contract and dry-runs it on a local Spark session,
    then keeps a snapshot of its source (`source`, also written under the jobs directory's
    `.registered/` for the stage processes). Versions are never edited: registering a changed
    module writes the next version, with who and when, so the history is the audit trail; a job
    runs the version it was started with (`Job.topology` = `NAME@VERSION`).
    """

    name = models.CharField(max_length=32)
    version = models.PositiveIntegerField()
    module = models.CharField(
        max_length=200,
        blank=True,
        help_text="package.module:attribute in the jobs dir (empty for an app)",
    )
    app = models.CharField(
        max_length=200,
        blank=True,
        help_text="An existing app's path in the jobs dir, run as it is (empty for a job module)",
    )
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
