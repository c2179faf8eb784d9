"""Celery tasks. Thin: take ids, call services, spell out their reliability options."""

from dataclasses import replace

from celery import shared_task

from console.redis import redis_client
from console.services import retention
from console.services.prediction import train_fault_predictor as train
from infra import tasks


@shared_task(**tasks.PURGE_OLD_RECORDS.options())
def purge_old_records() -> dict:
    """Delete every kind of record past its retention, in batches; return how many of each
    went (console/services/retention.py)."""
    return retention.purge_old_records(redis_client())


@shared_task(**tasks.PURGE_OLD_METRICS.options())
def purge_old_metrics(hours: float | None = None) -> dict:
    """The purge under its old name (schedules made before purge_old_records call it): every
    kind, with `hours` instead of METRIC_RETENTION_HOURS for the metric samples if given."""
    settings = retention.Retention.from_settings()
    if hours:
        settings = replace(settings, metric_hours=hours)
    return retention.purge_old_records(redis_client(), settings)


@shared_task(**tasks.TRAIN_FAULT_PREDICTOR.options())
def train_fault_predictor() -> str:
    """Fit the fault predictor on recorded history and store the run; the policy cycles that
    follow use it if it beat the prior on held-out data."""

    run = train()
    return f"predictor #{run.pk}: {run.reason}"
