"""Celery tasks. Thin: take ids, call services, spell out their reliability options."""

from celery import shared_task
from django.conf import settings


@shared_task(
    name="backstop.purge_old_metrics",
    acks_late=True,  # idempotent: deleting already-deleted rows is a no-op
    expires=600,
    time_limit=120,
    soft_time_limit=100,
)
def purge_old_metrics(hours: float | None = None) -> int:
    """Delete MetricSample rows older than the retention period; return how many went."""
    from console.models import MetricSample

    deleted, _ = MetricSample.objects.older_than(hours or settings.METRIC_RETENTION_HOURS).delete()
    return deleted


@shared_task(
    name="backstop.train_fault_predictor",
    acks_late=True,  # a run killed half-way stored nothing; running it again only adds a row
    expires=600,
    time_limit=300,
    soft_time_limit=240,
)
def train_fault_predictor() -> str:
    """Fit the fault predictor on recorded history and store the run; the policy cycles that
    follow use it if it beat the prior on held-out data."""
    from console.services.prediction import train_fault_predictor as train

    run = train()
    return f"predictor #{run.pk}: {run.reason}"
