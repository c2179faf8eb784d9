"""The controller's periodic tasks, kept in django-celery-beat so admins can see and edit them."""

from __future__ import annotations

from django_celery_beat.models import IntervalSchedule, PeriodicTask

# name -> (task, every N seconds)
PERIODIC_TASKS = {
    "backstop: controller watchdog": ("backstop.controller.watchdog", 5),
    # Every kind of record past its retention (console/services/retention.py). Databases made
    # before it still have "backstop: purge old metrics", which now purges every kind too.
    "backstop: purge old records": ("backstop.purge_old_records", 3600),
    # The policy cycles read the newest run; every 5 min keeps it close to what just happened.
    "backstop: train fault predictor": ("backstop.train_fault_predictor", 300),
    # Alert deliveries whose message was lost (a worker died, the broker dropped it) are sent
    # again within this (console/services/alert_routing.py).
    "backstop: sweep alert deliveries": ("backstop.alerts.sweep", 5),
}


def ensure_periodic_tasks() -> list[str]:
    """Create the controller's schedules if missing (existing ones keep their edits)."""
    created = []
    for name, (task, seconds) in PERIODIC_TASKS.items():
        interval, _ = IntervalSchedule.objects.get_or_create(
            every=seconds, period=IntervalSchedule.SECONDS
        )
        _, was_created = PeriodicTask.objects.get_or_create(
            name=name, defaults={"task": task, "interval": interval}
        )
        if was_created:
            created.append(name)
    return created


def schedule_drill(job_id: int, kind: str, every_s: int, *, target_operator="", target_node=""):
    """A recurring chaos drill on a job (e.g. kill-driver every 300 s, as in the papers)."""
    import json

    interval, _ = IntervalSchedule.objects.get_or_create(
        every=every_s, period=IntervalSchedule.SECONDS
    )
    task, _ = PeriodicTask.objects.update_or_create(
        name=f"backstop: drill {kind} on job {job_id}",
        defaults={
            "task": "backstop.controller.drill",
            "interval": interval,
            "kwargs": json.dumps(
                {
                    "job_id": job_id,
                    "kind": kind,
                    "target_operator": target_operator,
                    "target_node": target_node,
                }
            ),
        },
    )
    return task
