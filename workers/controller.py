"""Controller tasks (queue `control`). Thin: take ids, call console.services.

Supervision is not a task: a Celery worker that consumes the `control` queue also runs the
fleet supervision of console/services/fleet.py (BACKSTOP_SUPERVISION_WORKERS reconcile threads
over a work queue, per-job leases in Redis), started when the worker is ready and stopped, its
leases given up for the other controllers, when it shuts down.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.signals import worker_ready, worker_shutting_down
from django.conf import settings
from django.db import OperationalError

from console.models import FaultInjection, Job, JobUpgrade, Node
from console.redis import redis_client
from console.services import controller, faults, recovery, upgrade_audit, upgrade_state_check
from console.services.control import act, observe, record
from console.services.fleet import FleetController
from infra import tasks
from infra.queues import CONTROL_QUEUE

log = logging.getLogger(__name__)

# The fleet supervision of this process, when it is a controller.
_fleet: FleetController | None = None


@shared_task(**tasks.LAUNCH_JOB.options(autoretry_for=(OperationalError, controller.LaunchBusy)))
def launch_job(job_id: int) -> str:
    """Plan and start a created job; a controller's fleet supervision takes it from there."""

    job = Job.objects.get(pk=job_id)
    if job.status not in (Job.Status.CREATED, Job.Status.STOPPED, Job.Status.FAILED):
        return f"job {job_id} is {job.status}: not launched again"
    try:
        controller.launch_job(job)
    except controller.LaunchError as exc:
        job.mark_failed(f"could not launch: {exc}")
        record.alert_failed_job(job)
        return str(exc)
    return f"launched job {job_id}"


@shared_task(**tasks.WATCHDOG.options())
def watchdog() -> list[int]:
    """Refresh node states, metrics and Q scores, release warm spares no live job can use,
    give the open recovery episodes of ended jobs their final figures, ask again for the audit
    of ended upgrades not audited yet, fail the Spark kills no agent reported on, and name the
    live jobs no controller holds (none while a controller runs: they are taken within a
    renewal)."""
    client = redis_client()
    observe.update_nodes(client)
    act.release_unused_spares(client)
    record.close_episodes_of_ended_jobs(client)
    upgrade_audit.enqueue_unaudited(client)
    faults.expire_unreported_spark_kills()
    unsupervised = observe.unsupervised_jobs(client)
    if unsupervised:
        log.warning("watchdog: live jobs no controller supervises: %s", unsupervised)
    return unsupervised


@shared_task(**tasks.AUDIT_EPISODES.options(autoretry_for=(OperationalError,)))
def audit_episodes(job_id: int) -> int:
    """Audit the output of job `job_id` for its closed, not yet audited recovery episodes."""

    client = redis_client()
    try:
        return recovery.audit_closed_episodes(Job.objects.get(pk=job_id), client)
    finally:
        client.close()


@shared_task(
    **tasks.CHECK_UPGRADE.options(
        autoretry_for=(OperationalError,),
        time_limit=upgrade_state_check.CHECK_TIMEOUT_S + 60,
        soft_time_limit=upgrade_state_check.CHECK_TIMEOUT_S + 30,
    )
)
def check_upgrade(upgrade_id: int) -> str:
    """Decide a requested upgrade's case by a dry run on the running version's state; refuse
    it or have the job's controller start the new version."""
    client = redis_client()
    try:
        upgrade = upgrade_state_check.check_upgrade(
            JobUpgrade.objects.select_related("job").get(pk=upgrade_id),
            client,
            runner=_fleet.owner if _fleet is not None else "",
        )
    finally:
        client.close()
    return f"upgrade {upgrade_id}: {upgrade.case} ({upgrade.reason})"


@shared_task(**tasks.AUDIT_UPGRADE.options(autoretry_for=(OperationalError,)))
def audit_upgrade(upgrade_id: int) -> str:
    """Measure an ended upgrade's output gap across its switch and audit the job's output
    against the version in force; the figures go on the upgrade's record."""
    client = redis_client()
    try:
        return upgrade_audit.audit_upgrade(upgrade_id, client)
    finally:
        client.close()


@shared_task(**tasks.INJECT_FAULT.options())
def inject_fault(fault_id: int) -> str:
    """Inject a requested fault."""

    fault = faults.inject(
        FaultInjection.objects.select_related("job", "target_node").get(pk=fault_id)
    )
    return f"fault {fault_id}: {fault.outcome} ({fault.outcome_detail})"


@shared_task(**tasks.DRILL.options())
def drill(job_id: int, kind: str, target_operator: str = "", target_node: str = "") -> str:
    """A scheduled chaos drill (django-celery-beat): request and inject one fault."""

    job = Job.objects.get(pk=job_id)
    node = Node.objects.get(name=target_node) if target_node else None
    try:
        fault = faults.request_fault(job, kind, target_operator=target_operator, target_node=node)
    except faults.FaultRefused as exc:
        return f"drill refused: {exc}"
    faults.inject(fault)
    return f"drill {kind} on job {job_id}: {fault.outcome}"


@worker_ready.connect
def start_fleet_supervision(sender=None, **kwargs) -> None:
    """A worker that consumes the control queue supervises its share of the live jobs."""
    global _fleet
    consumed = sender.app.amqp.queues.consume_from or {}
    if CONTROL_QUEUE not in consumed or settings.SUPERVISION_WORKERS <= 0:
        return
    _fleet = FleetController(settings.SUPERVISION_WORKERS)
    _fleet.start()


@worker_shutting_down.connect
def stop_fleet_supervision(**kwargs) -> None:
    """Give this controller's jobs up at once, so the others take them without waiting out the
    leases."""
    if _fleet is not None:
        _fleet.stop()
