"""Controller tasks (queue `control`). Thin: take ids, call console.services.

Supervision runs as a chain of bounded windows: `supervise_job` holds a lease in Redis while it
ticks for SUPERVISE_WINDOW_S, then enqueues its successor. If the controller process dies, the
lease expires within LEASE_S and the beat-driven `watchdog` starts a new window on whichever
controller is alive; the supervision state lives in Redis, so nothing is lost.
"""

from __future__ import annotations

import contextlib
import logging

from celery import shared_task
from django.db import OperationalError
from redis.exceptions import LockError, LockNotOwnedError

from workers.redis_client import redis_client

log = logging.getLogger(__name__)

SUPERVISE_WINDOW_S = 30.0
LEASE_S = 5.0


@shared_task(
    name="backstop.controller.launch_job",
    acks_late=True,  # idempotent: a job that is not in `created` is not launched again
    # A database that is briefly unavailable (a locked SQLite file, a PostgreSQL restart) must
    # not leave the job `created` for ever. Retrying is safe: before the job turns `starting`
    # nothing has started; after, the watchdog supervises it and supervision restarts replicas
    # that never came up.
    autoretry_for=(OperationalError,),
    retry_backoff=2,
    max_retries=5,
    expires=300,
    time_limit=120,
    soft_time_limit=100,
)
def launch_job(job_id: int) -> str:
    """Plan and start a created job, then start supervising it."""
    from console.models import Job
    from console.services import controller
    from console.services.control import record

    job = Job.objects.get(pk=job_id)
    if job.status not in (Job.Status.CREATED, Job.Status.STOPPED, Job.Status.FAILED):
        return f"job {job_id} is {job.status}: not launched again"
    try:
        controller.launch_job(job)
    except controller.LaunchError as exc:
        job.mark_failed(f"could not launch: {exc}")
        record.alert_failed_job(job)
        return str(exc)
    supervise_job.apply_async(args=(job_id,))
    return f"launched job {job_id}"


@shared_task(
    name="backstop.controller.supervise_job",
    acks_late=True,  # idempotent: the lease keeps a redelivered copy from double-supervising
    time_limit=SUPERVISE_WINDOW_S + 60,
    soft_time_limit=SUPERVISE_WINDOW_S + 30,
)
def supervise_job(job_id: int) -> str:
    """Supervise a job for one window while holding its lease; then hand over to the next."""
    from console.models import Job
    from console.services import controller
    from workers.keys import controller_lease

    client = redis_client()
    job = Job.objects.get(pk=job_id)
    # redis-py's Lock: a random token, renewed and released only while it is still ours.
    lease = client.lock(controller_lease(job.key), timeout=LEASE_S)
    if not lease.acquire(blocking=False):
        return f"job {job_id} is supervised elsewhere"
    try:
        live = controller.supervise_window(job, client, SUPERVISE_WINDOW_S, lease.reacquire)
    except LockNotOwnedError:
        # The lease expired (this worker stalled past LEASE_S) and another window may run now:
        # stop here rather than supervise the job twice.
        log.warning("job %s: supervision lease lost; leaving the job to its new holder", job_id)
        return f"job {job_id}: lease lost"
    finally:
        with contextlib.suppress(LockError):
            lease.release()
    if live:
        supervise_job.apply_async(args=(job_id,))
    return f"job {job_id} supervised for a window (live={live})"


@shared_task(
    name="backstop.controller.watchdog",
    expires=10,  # a watchdog run that waited longer than the next one is worthless
    time_limit=30,
    soft_time_limit=25,
)
def watchdog() -> list[int]:
    """Refresh node states and metrics, release warm spares no live job can use, give the open
    recovery episodes of ended jobs their final figures, and restart supervision of live jobs
    nobody supervises."""
    from console.models import Job
    from console.services.control import act, observe, record
    from workers.keys import controller_lease

    client = redis_client()
    observe.update_nodes(client)
    act.release_unused_spares(client)
    record.close_episodes_of_ended_jobs(client)
    restarted = []
    for job in Job.objects.filter(status__in=Job.LIVE_STATUSES):
        if not client.exists(controller_lease(job.key)):
            supervise_job.apply_async(args=(job.pk,))
            restarted.append(job.pk)
    if restarted:
        log.info("watchdog: resumed supervision of jobs %s", restarted)
    return restarted


@shared_task(
    name="backstop.controller.audit_episodes",
    acks_late=True,  # idempotent: an audited episode is left alone
    autoretry_for=(OperationalError,),
    retry_backoff=2,
    max_retries=3,
    expires=600,
    time_limit=300,
    soft_time_limit=280,
)
def audit_episodes(job_id: int) -> int:
    """Audit the output of job `job_id` for its closed, not yet audited recovery episodes."""
    from console.models import Job
    from console.services import recovery

    client = redis_client()
    try:
        return recovery.audit_closed_episodes(Job.objects.get(pk=job_id), client)
    finally:
        client.close()


@shared_task(
    name="backstop.controller.inject_fault",
    acks_late=True,  # idempotent: only pending faults are injected
    expires=60,
    time_limit=30,
    soft_time_limit=25,
)
def inject_fault(fault_id: int) -> str:
    """Inject a requested fault."""
    from console.models import FaultInjection
    from console.services import faults

    fault = faults.inject(
        FaultInjection.objects.select_related("job", "target_node").get(pk=fault_id)
    )
    return f"fault {fault_id}: {fault.outcome} ({fault.outcome_detail})"


@shared_task(
    name="backstop.controller.drill",
    expires=60,
    time_limit=30,
    soft_time_limit=25,
)
def drill(job_id: int, kind: str, target_operator: str = "", target_node: str = "") -> str:
    """A scheduled chaos drill (django-celery-beat): request and inject one fault."""
    from console.models import Job, Node
    from console.services import faults

    job = Job.objects.get(pk=job_id)
    node = Node.objects.get(name=target_node) if target_node else None
    try:
        fault = faults.request_fault(job, kind, target_operator=target_operator, target_node=node)
    except faults.FaultRefused as exc:
        return f"drill refused: {exc}"
    faults.inject(fault)
    return f"drill {kind} on job {job_id}: {fault.outcome}"
