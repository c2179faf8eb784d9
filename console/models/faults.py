"""Faults asked for (by a person or a schedule) and the recovery episodes measured after them."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models

from console.models.jobs import Job
from console.models.replicas import Node


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
        SLOW_DRIVER = "slow-driver", "each batch of a stage's primary N s longer, for M seconds"
        KAFKA_BROKER = "kafka-broker", "stop the job's Kafka broker (Backstop's own) for N seconds"

    class Outcome(models.TextChoices):
        PENDING = "pending", "pending"
        INJECTED = "injected", "injected"
        FAILED = "failed", "failed"
        REFUSED = "refused", "refused"

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

    @classmethod
    def behind_failure(cls, job: Job, seen_at: datetime, window_s: float = 60.0):
        """The fault most likely behind a failure of `job` seen at `seen_at`: the latest one
        injected within `window_s` before it, or None. A fault counts as injected from just
        before it is sent (services/faults.inject), so the failure it causes finds it."""
        return (
            cls.objects.filter(
                job=job,
                outcome=cls.Outcome.INJECTED,
                injected_at__gte=seen_at - timedelta(seconds=window_s),
                injected_at__lte=seen_at,
            )
            .order_by("-injected_at")
            .first()
        )


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
    # Where the recovery's time went: mark -> epoch s, and "replica": the replica that took over
    # (console/policy/recovery_phases.py names the marks and who takes them).
    phases = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-detected_at"]

    def __str__(self):
        return f"{self.job.name} {self.stage} @ {self.detected_at:%Y-%m-%d %H:%M:%S}"
