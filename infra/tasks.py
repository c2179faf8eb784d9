"""Celery tasks by their registered names, in one place.

The console sends tasks by name (`send`), so it never imports the task modules in workers/,
which import the console. The task modules register under the same names and take their
expiry from here: `expires` is an option of the message, set by the sender, so it belongs with
the name rather than with the task's decorator alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery import current_app


@dataclass(frozen=True)
class TaskName:
    """A task's registered name and how long a message for it may wait before it is dropped."""

    name: str
    expires_s: float | None = None


# Node agents (sent to the node's queue, infra.queues.node_queue).
START_REPLICA = TaskName("backstop.agent.start_replica", expires_s=60)
START_GENERATOR = TaskName("backstop.agent.start_generator", expires_s=60)
KILL_REPLICA = TaskName("backstop.agent.kill_replica", expires_s=30)
KILL_NODE = TaskName("backstop.agent.kill_node", expires_s=30)
KILL_SPARK_PROCESS = TaskName("backstop.agent.kill_spark_process", expires_s=30)
PAUSE_NODE = TaskName("backstop.agent.pause_node", expires_s=30)
STRESS_NODE = TaskName("backstop.agent.stress_node", expires_s=30)

# The controller (queue `control`).
LAUNCH_JOB = TaskName("backstop.controller.launch_job", expires_s=300)
WATCHDOG = TaskName("backstop.controller.watchdog", expires_s=10)
AUDIT_EPISODES = TaskName("backstop.controller.audit_episodes", expires_s=600)
INJECT_FAULT = TaskName("backstop.controller.inject_fault", expires_s=60)
DRILL = TaskName("backstop.controller.drill", expires_s=60)
CHECK_UPGRADE = TaskName("backstop.controller.check_upgrade", expires_s=600)
AUDIT_UPGRADE = TaskName("backstop.controller.audit_upgrade", expires_s=600)

# Reports, alerts and housekeeping.
SEND_REPORT = TaskName("backstop.send_report", expires_s=3600)
ALERT_RECOVERY = TaskName("backstop.alert_recovery", expires_s=600)
ALERT_JOB_FAILED = TaskName("backstop.alert_job_failed", expires_s=3600)
ALERT_KAFKA = TaskName("backstop.alert_kafka", expires_s=600)
ALERT_RECONCILE_FAILING = TaskName("backstop.alert_reconcile_failing", expires_s=600)
# Alert deliveries (queue `alerts`): no expiry, a delivery is only ever late, never dropped.
DELIVER_ALERT = TaskName("backstop.alerts.deliver")
SWEEP_ALERT_DELIVERIES = TaskName("backstop.alerts.sweep", expires_s=30)
PURGE_OLD_METRICS = TaskName("backstop.purge_old_metrics", expires_s=600)
PURGE_OLD_RECORDS = TaskName("backstop.purge_old_records", expires_s=600)
TRAIN_FAULT_PREDICTOR = TaskName("backstop.train_fault_predictor", expires_s=600)


def send(task: TaskName, *args, queue: str | None = None, expires_s: float | None = None, **kwargs):
    """Send `task` with positional `args` and keyword `kwargs` through the current Celery app.

    queue: a node agent's queue for agent tasks; None routes by the app's task routes (the
    controller's tasks go to `control`). expires_s: instead of the task's own expiry."""
    options = {"queue": queue} if queue else {}
    expires = expires_s if expires_s is not None else task.expires_s
    if expires is not None:
        options["expires"] = expires
    return current_app.send_task(task.name, args=args, kwargs=kwargs, **options)
