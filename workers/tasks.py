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
