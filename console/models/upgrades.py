"""Upgrades of running jobs: one record per upgrade (blue/green: spark_runtime/upgrade.py; a
change of strategy in place: Supervisor.change_strategy)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from console.models.jobs import Job


class JobUpgrade(models.Model):
    """One upgrade of a running job to another registered version, other operator parameters or
    another fault-tolerance strategy.

    Its `status` is what was asked and what happened: an operator asks (requested), the job's
    controller starts the new version beside the running one (starting), switches the output
    over (validating), and ends it: confirmed (the old version retires) or rolled back (the old
    version writes again), or refused before anything started (the state check said no).
    `gap_s`, `lost` and `duplicates` are measured from the job's output across the switch.
    """

    class Status(models.TextChoices):
        REQUESTED = "requested", "requested"
        STARTING = "starting", "new version starting and catching up"
        SWITCHING = "switching", "switching the output over"
        VALIDATING = "validating", "new version writes; the old one stands by"
        CONFIRMED = "confirmed", "confirmed"
        ROLLED_BACK = "rolled_back", "rolled back"
        REFUSED = "refused", "refused"
        ABANDONED = "abandoned", "abandoned (the job stopped or failed meanwhile)"

    class Case(models.TextChoices):
        SEEDED = "seeded", "compatible state: seeded from the running version's checkpoint"
        REBUILD = "rebuild", "incompatible state: rebuilt from the input the job retains"
        REFUSED = "refused", "refused"
        IN_PLACE = "in_place", "strategy only: the running replicas go on, the protection changes"
        APP_RESTART = "app_restart", "an app: stopped, started from its checkpoints, validated"

    class Mode(models.TextChoices):
        BLUE_GREEN = "blue_green", "blue/green: the new version beside the running one"
        STOP_RESTART = "stop_restart", "stop and restart from the checkpoint (an output gap)"

    # Statuses in which the job's controller still has something to do.
    UNDER_WAY = (Status.REQUESTED, Status.STARTING, Status.SWITCHING, Status.VALIDATING)

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="upgrades")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    requested_at = models.DateTimeField(auto_now_add=True)
    stage = models.CharField(max_length=64, blank=True, help_text="The stage upgraded.")
    from_topology = models.CharField(max_length=48)
    to_topology = models.CharField(max_length=48)
    from_params = models.JSONField(default=dict, blank=True)
    to_params = models.JSONField(default=dict, blank=True)
    # The strategy (spark_runtime/strategies.py) before and after; equal unless the upgrade
    # changes it. A strategy change is an upgrade of its own (no version or parameter change).
    from_strategy = models.CharField(max_length=20, blank=True)
    to_strategy = models.CharField(max_length=20, blank=True)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.BLUE_GREEN)
    result_preserving = models.BooleanField(
        default=False,
        help_text="Declared by whoever asked: the new version computes the same results. The "
        "old version then checks the new one's results against its own while validating, and "
        "a difference rolls the upgrade back.",
    )
    # What the old version has found so far, checking a result-preserving upgrade.
    results_compared = models.IntegerField(
        null=True, blank=True, help_text="Keys whose results the old version compared."
    )
    results_differing = models.IntegerField(
        null=True, blank=True, help_text="Of those, keys whose results differ."
    )
    case = models.CharField(max_length=16, choices=Case.choices, blank=True)
    reason = models.TextField(blank=True, help_text="Why this case, in plain words.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.REQUESTED)
    # What the operator asked for last while the upgrade runs: "" (let it run), "confirm" or
    # "rollback". The controller carries it out at its next reconcile.
    requested_action = models.CharField(max_length=16, blank=True)
    blue_replica = models.CharField(max_length=100, blank=True)
    green_replica = models.CharField(max_length=100, blank=True)
    checkpoint_batch = models.IntegerField(
        null=True, blank=True, help_text="The running version's committed batch green started from."
    )
    switched_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    ended_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who confirmed or rolled back by hand (empty: the controller did).",
    )
    outcome = models.TextField(blank=True, help_text="Why it ended the way it did.")
    gap_s = models.FloatField(null=True, blank=True, help_text="Output gap across the switch.")
    lost = models.IntegerField(null=True, blank=True)
    duplicates = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at"]

    def __str__(self):
        return f"{self.job.name}: {self.from_topology} -> {self.to_topology} ({self.status})"

    @property
    def under_way(self) -> bool:
        return self.status in self.UNDER_WAY

    @property
    def status_label(self) -> str:
        """What the status means for this upgrade: an existing app (case APP_RESTART) runs as
        one copy, stopped and started again, never beside its new version."""
        if self.case == self.Case.APP_RESTART and self.status in APP_STATUS_LABELS:
            return APP_STATUS_LABELS[self.status]
        return self.Status(self.status).label

    @property
    def changes_strategy(self) -> bool:
        """Whether the upgrade changes the job's strategy (and nothing else: a strategy change
        is an upgrade of its own). Records from before strategies changed leave both empty."""
        return bool(self.to_strategy) and self.to_strategy != self.from_strategy


# The statuses whose general label (the new version beside the old one) is wrong for an app.
APP_STATUS_LABELS = {
    JobUpgrade.Status.SWITCHING: "the app's queries stopping; the new version then starts "
    "from their checkpoints",
    JobUpgrade.Status.VALIDATING: "the new version runs from the checkpoints; confirmed once "
    "each query completes a batch, else the old version restarts from them",
}
