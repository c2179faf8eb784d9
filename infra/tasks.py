"""Celery tasks by their registered names, with their options, in one place.

The console sends tasks by name (`send`), so it never imports the task modules in workers/,
which import the console. The task modules register under the same names with the options
given here (`@shared_task(**tasks.X.options())`): expiry, acknowledgement, time limits and
retries are read in one file, where a change to one task's is next to all the others'.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery import current_app


@dataclass(frozen=True)
class Retry:
    """Celery's retry of a task that raised one of the worker's `autoretry_for` exceptions
    (those are named at the task: they are the worker's, e.g. the database's)."""

    max_retries: int | None  # None: Celery never gives up (the task's own count decides)
    backoff_s: float = 2.0  # the first wait; each next one doubles
    backoff_max_s: float = 600.0
    jitter: bool = True


@dataclass(frozen=True)
class TaskName:
    """A task's registered name and every option of it, in one place: the sender's (how long a
    message may wait before it is dropped) and the worker's (`options()`, for the decorator)."""

    name: str
    expires_s: float | None = None
    # Acknowledged after it ran, so a worker killed mid-task leaves the message to run again:
    # only for tasks that are idempotent (each says why at its definition).
    acks_late: bool = False
    reject_on_worker_lost: bool = False
    time_limit_s: float | None = None  # hard; the soft limit raises in the task first
    soft_time_limit_s: float | None = None
    retry: Retry | None = None

    def options(self, **extra) -> dict:
        """The keyword arguments of the task's `shared_task` decorator, with `extra` (the
        worker's own: `bind`, `autoretry_for`)."""
        options = {"name": self.name, "acks_late": self.acks_late}
        if self.expires_s is not None:
            options["expires"] = self.expires_s
        if self.reject_on_worker_lost:
            options["reject_on_worker_lost"] = True
        if self.time_limit_s is not None:
            options["time_limit"] = self.time_limit_s
        if self.soft_time_limit_s is not None:
            options["soft_time_limit"] = self.soft_time_limit_s
        if self.retry is not None:
            options.update(
                max_retries=self.retry.max_retries,
                retry_backoff=self.retry.backoff_s,
                retry_backoff_max=self.retry.backoff_max_s,
                retry_jitter=self.retry.jitter,
            )
        return {**options, **extra}


# An agent's command: over quickly; start and kill are idempotent (a replica id starts once,
# and a kill of a process that is gone is a no-op), the pause and stress of a fault are not.
AGENT_LIMITS = {"time_limit_s": 30, "soft_time_limit_s": 25}
# Emails: a transient SMTP failure is retried 30 s, 60 s, 120 s, 240 s later (with jitter);
# never acks_late, as a redelivered message would send the email twice.
EMAIL = {
    "retry": Retry(max_retries=4, backoff_s=30),
    "time_limit_s": 180,
    "soft_time_limit_s": 150,
}
# A purge stops starting batches after RETENTION_MAX_SECONDS; the limits leave it room.
PURGE = {"acks_late": True, "time_limit_s": 900, "soft_time_limit_s": 840}

# Node agents (sent to the node's queue, infra.queues.node_queue).
START_REPLICA = TaskName(
    "backstop.agent.start_replica", expires_s=60, acks_late=True, **AGENT_LIMITS
)
START_GENERATOR = TaskName(
    "backstop.agent.start_generator", expires_s=60, acks_late=True, **AGENT_LIMITS
)
KILL_REPLICA = TaskName("backstop.agent.kill_replica", expires_s=30, acks_late=True, **AGENT_LIMITS)
KILL_NODE = TaskName("backstop.agent.kill_node", expires_s=30, acks_late=True, **AGENT_LIMITS)
KILL_SPARK_PROCESS = TaskName(
    "backstop.agent.kill_spark_process", expires_s=30, acks_late=True, **AGENT_LIMITS
)
PAUSE_NODE = TaskName("backstop.agent.pause_node", expires_s=30, **AGENT_LIMITS)
STRESS_NODE = TaskName("backstop.agent.stress_node", expires_s=30, **AGENT_LIMITS)

# The controller (queue `control`).
# Idempotent: a job that is not in `created` is not launched again. Retried while the database
# is briefly away or another holds the job's lease (the worker names those exceptions).
LAUNCH_JOB = TaskName(
    "backstop.controller.launch_job",
    expires_s=300,
    acks_late=True,
    time_limit_s=120,
    soft_time_limit_s=100,
    retry=Retry(max_retries=5),
)
# A watchdog run that waited longer than the next one is worthless.
WATCHDOG = TaskName(
    "backstop.controller.watchdog", expires_s=10, time_limit_s=30, soft_time_limit_s=25
)
# Idempotent: an audited episode is left alone. It reads the job's whole input.
AUDIT_EPISODES = TaskName(
    "backstop.controller.audit_episodes",
    expires_s=600,
    acks_late=True,
    time_limit_s=300,
    soft_time_limit_s=280,
    retry=Retry(max_retries=3),
)
INJECT_FAULT = TaskName(  # idempotent: only pending faults are injected
    "backstop.controller.inject_fault",
    expires_s=60,
    acks_late=True,
    time_limit_s=30,
    soft_time_limit_s=25,
)
DRILL = TaskName("backstop.controller.drill", expires_s=60, time_limit_s=30, soft_time_limit_s=25)
# Idempotent: an upgrade checked already is left alone. Its time limits follow the dry run's
# bound (console.services.upgrade_state_check.CHECK_TIMEOUT_S), given at the task.
CHECK_UPGRADE = TaskName(
    "backstop.controller.check_upgrade", expires_s=600, acks_late=True, retry=Retry(max_retries=3)
)
AUDIT_UPGRADE = TaskName(  # idempotent: an audited upgrade is left alone
    "backstop.controller.audit_upgrade",
    expires_s=600,
    acks_late=True,
    time_limit_s=300,
    soft_time_limit_s=280,
    retry=Retry(max_retries=3),
)

# Reports, alerts and housekeeping.
# A report that could not start within an hour is dropped; the next scheduled one covers it.
SEND_REPORT = TaskName("backstop.send_report", expires_s=3600, **EMAIL)
ALERT_RECOVERY = TaskName("backstop.alert_recovery", expires_s=600, **EMAIL)
ALERT_JOB_FAILED = TaskName("backstop.alert_job_failed", expires_s=3600, **EMAIL)
ALERT_KAFKA = TaskName("backstop.alert_kafka", expires_s=600, **EMAIL)
ALERT_RECONCILE_FAILING = TaskName("backstop.alert_reconcile_failing", expires_s=600, **EMAIL)
# Alert deliveries (queue `alerts`): no expiry, a delivery is only ever late, never dropped.
# Safe to run twice (alert_routing.deliver claims its row first). The service counts attempts
# and gives up (alerting_payloads.MAX_ATTEMPTS): Celery's own count must not stop it sooner.
# One HTTP attempt is bounded by alert_routing.HTTP_TIMEOUT_S; the limit only stops a hung SMTP.
DELIVER_ALERT = TaskName(
    "backstop.alerts.deliver",
    acks_late=True,
    reject_on_worker_lost=True,
    time_limit_s=60,
    soft_time_limit_s=45,
    retry=Retry(max_retries=None),
)
SWEEP_ALERT_DELIVERIES = TaskName("backstop.alerts.sweep", expires_s=30)
PURGE_OLD_METRICS = TaskName("backstop.purge_old_metrics", expires_s=600, **PURGE)
PURGE_OLD_RECORDS = TaskName("backstop.purge_old_records", expires_s=600, **PURGE)
# A run killed half-way stored nothing; running it again only adds a row.
TRAIN_FAULT_PREDICTOR = TaskName(
    "backstop.train_fault_predictor",
    expires_s=600,
    acks_late=True,
    time_limit_s=300,
    soft_time_limit_s=240,
)


def send(task: TaskName, *args, queue: str | None = None, expires_s: float | None = None, **kwargs):
    """Send `task` with positional `args` and keyword `kwargs` through the current Celery app.

    queue: a node agent's queue for agent tasks; None routes by the app's task routes (the
    controller's tasks go to `control`). expires_s: instead of the task's own expiry."""
    options = {"queue": queue} if queue else {}
    expires = expires_s if expires_s is not None else task.expires_s
    if expires is not None:
        options["expires"] = expires
    return current_app.send_task(task.name, args=args, kwargs=kwargs, **options)
