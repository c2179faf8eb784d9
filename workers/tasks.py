"""Celery tasks. Thin: take ids, call services, spell out their reliability options."""

from dataclasses import replace

from celery import shared_task

from console.redis import redis_client
from console.services import retention
from console.services.prediction import train_fault_predictor as train
from infra import tasks

# A purge run stops starting batches after RETENTION_MAX_SECONDS; the limits leave it room.
PURGE_TIME_LIMIT_S = 900


@shared_task(
    name=tasks.PURGE_OLD_RECORDS.name,
    acks_late=True,  # idempotent: deleting already-deleted rows is a no-op
    expires=tasks.PURGE_OLD_RECORDS.expires_s,
    time_limit=PURGE_TIME_LIMIT_S,
    soft_time_limit=PURGE_TIME_LIMIT_S - 60,
)
def purge_old_records() -> dict:
    """Delete every kind of record past its retention, in batches; return how many of each
    went (console/services/retention.py)."""
    return retention.purge_old_records(redis_client())


@shared_task(
    name=tasks.PURGE_OLD_METRICS.name,
    acks_late=True,
    expires=tasks.PURGE_OLD_METRICS.expires_s,
    time_limit=PURGE_TIME_LIMIT_S,
    soft_time_limit=PURGE_TIME_LIMIT_S - 60,
)
def purge_old_metrics(hours: float | None = None) -> dict:
    """The purge under its old name (schedules made before purge_old_records call it): every
    kind, with `hours` instead of METRIC_RETENTION_HOURS for the metric samples if given."""
    settings = retention.Retention.from_settings()
    if hours:
        settings = replace(settings, metric_hours=hours)
    return retention.purge_old_records(redis_client(), settings)


@shared_task(
    name=tasks.TRAIN_FAULT_PREDICTOR.name,
    acks_late=True,  # a run killed half-way stored nothing; running it again only adds a row
    expires=tasks.TRAIN_FAULT_PREDICTOR.expires_s,
    time_limit=300,
    soft_time_limit=240,
)
def train_fault_predictor() -> str:
    """Fit the fault predictor on recorded history and store the run; the policy cycles that
    follow use it if it beat the prior on held-out data."""

    run = train()
    return f"predictor #{run.pk}: {run.reason}"
