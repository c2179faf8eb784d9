"""The versioned fault-tolerance policy (its history is its audit trail) and the training runs of
the fault predictor that feeds it."""

from __future__ import annotations

from dataclasses import fields as dataclass_fields

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from console.policy.config import BOUNDS, PolicyConfig, PolicyConfigError


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
