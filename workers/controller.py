"""Controller tasks (queue `control`). Thin: take ids, call console.services.

Supervision runs as a chain of bounded windows: `supervise_job` holds a lease in Redis while it
ticks for SUPERVISE_WINDOW_S, then enqueues its successor. If the controller process dies, the
lease expires within LEASE_S and the beat-driven `watchdog` starts a new window on whichever
controller is alive; the supervision state lives in Redis, so nothing is lost.
"""

from __future__ import annotations

import logging
import uuid

from celery import shared_task

from workers.redis_client import redis_client

log = logging.getLogger(__name__)

SUPERVISE_WINDOW_S = 30.0
LEASE_S = 5.0

# Renew the lease only while it is still ours (compare-and-expire in one step).
_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


@shared_task(
    name="backstop.controller.launch_job",
    acks_late=True,  # idempotent: a job that is not in `created` is not launched again
    expires=300,
    time_limit=120,
    soft_time_limit=100,
)
def launch_job(job_id: int) -> str:
    """Plan and start a created job, then start supervising it."""
    from console.models import Job
    from console.services import controller

    job = Job.objects.get(pk=job_id)
    if job.status not in (Job.Status.CREATED, Job.Status.STOPPED, Job.Status.FAILED):
        return f"job {job_id} is {job.status}: not launched again"
    try:
        controller.launch_job(job)
    except controller.LaunchError as exc:
        job.mark_failed(f"could not launch: {exc}")
        controller.alert_failed_job(job)
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
    lease, token = controller_lease(job.key), uuid.uuid4().hex
    if not client.set(lease, token, nx=True, px=int(LEASE_S * 1000)):
        return f"job {job_id} is supervised elsewhere"
    renew = client.register_script(_RENEW)
    try:
        live = controller.supervise_window(
            job,
            client,
            SUPERVISE_WINDOW_S,
            keep_lease=lambda: renew([lease], [token, int(LEASE_S * 1000)]),
        )
    finally:
        client.register_script(_RELEASE)([lease], [token])
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
    """Refresh node states and metrics; restart supervision of live jobs nobody supervises."""
    from console.models import Job
    from console.services import controller
    from workers.keys import controller_lease

    client = redis_client()
    controller.update_nodes(client)
    restarted = []
    for job in Job.objects.filter(status__in=Job.LIVE_STATUSES):
        if not client.exists(controller_lease(job.key)):
            supervise_job.apply_async(args=(job.pk,))
            restarted.append(job.pk)
    if restarted:
        log.info("watchdog: resumed supervision of jobs %s", restarted)
    return restarted


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
