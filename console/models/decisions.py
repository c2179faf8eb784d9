"""The controller's decision log: what it decided or saw, and why."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from console.models.jobs import Job


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
        UPGRADE = "upgrade", "upgrade"
        KILL_STRAY = "kill-stray", "kill stray replica"
        STOP = "stop", "stop"

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
