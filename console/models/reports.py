"""Report subscriptions (who gets the periodic report and the alerts, when) and the alerts sent."""

from __future__ import annotations

import json

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import models, transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from console.models.jobs import Job
from console.models.teams import Team
from infra.queues import CONTROL_QUEUE


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
        TEAM = "team", "a team's jobs"

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
    team = models.ForeignKey(
        Team,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="report_subscriptions",
        help_text="Used when scope is a team's jobs.",
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
        """The jobs the subscription is about: every job, the chosen ones, or a team's."""
        if self.scope == self.Scope.ALL:
            return Job.objects.all()
        if self.scope == self.Scope.TEAM:
            return Job.objects.filter(team_id=self.team_id)
        return self.jobs.all()

    def covers(self, job: Job) -> bool:
        """True when `job` is in the subscription's scope."""
        return self.job_queryset().filter(pk=job.pk).exists()

    def sync_periodic_task(self) -> PeriodicTask:
        """Create or update the beat entry that sends this report (its name carries the id)."""
        values = {
            "name": f"backstop report #{self.pk}: {self.name}"[:200],
            "task": self.REPORT_TASK,
            "crontab": self.crontab,
            "interval": None,
            "kwargs": json.dumps({"subscription_id": self.pk}),
            "queue": CONTROL_QUEUE,
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

    `key` names the event: `recovery:<episode id>`, `job-failed:<job id>:<failure time>`, or
    `kafka-source:<job id>:<since>` and `kafka-lag:<job id>:<since>` (a Kafka condition, by when
    the controller first saw it).
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
