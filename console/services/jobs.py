"""Creating and stopping jobs. The API, the console and management commands all go through here."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil
from django.conf import settings
from django.db import transaction

from console.models import InvalidTransition, Job, Operator
from console.services.topologies import job_topology
from infra import tasks
from infra.processes import job_processes, spare_processes


class JobRequestError(Exception):
    """The job request is invalid; `field` names the offending input."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def validate_params(params: dict) -> dict:
    """Check the job parameters users may set; return them with defaults filled in.

    `rate`: input entries per second written by the job's generator (0: bring your own input);
    `count`: stop the generator after this many entries; `seed`: the generator's seed.
    """
    if not isinstance(params, dict):
        raise JobRequestError("params: must be an object", field="params")
    cleaned = {"rate": 200, **params}
    rate = cleaned["rate"]
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 100_000:
        raise JobRequestError("params.rate: events per second must be in [0, 100000]", "params")
    for name in ("count", "seed"):
        value = cleaned.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise JobRequestError(f"params.{name}: must be a whole number >= 0", "params")
    unknown = sorted(set(cleaned) - {"rate", "count", "seed"})
    if unknown:
        raise JobRequestError(f"params: unknown parameters {unknown}", "params")
    return cleaned


@transaction.atomic
def create_job(*, name: str, topology: str, strategy: str, params: dict | None, user=None) -> Job:
    """Create a job and one Operator row per operator of its topology (a built-in one, or a
    registered user job: its newest version unless `NAME@VERSION` is asked for)."""
    try:
        topology, spec = job_topology(topology)
    except KeyError as exc:
        raise JobRequestError(f"topology: {exc.args[0]}", field="topology") from None
    if strategy not in Job.Strategy.values:
        raise JobRequestError(
            f"strategy: must be one of {', '.join(Job.Strategy.values)}", field="strategy"
        )
    job = Job.objects.create(
        name=name,
        topology=topology,
        strategy=strategy,
        params=validate_params(params or {}),
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )
    Operator.objects.bulk_create(
        Operator(
            job=job,
            name=op.name,
            kind=op.kind,
            upstream=list(op.upstream),
            downstream=list(spec.downstream(op.name)),
            cpu_demand=op.cpu,
            mem_demand_mb=op.mem,
        )
        for op in spec.operators
    )
    dispatch(lambda: tasks.send(tasks.LAUNCH_JOB, job.pk))
    return job


def dispatch(send) -> None:
    """Send a controller task once the transaction commits (the worker must see the rows).

    CONTROLLER_DISPATCH=False (unit tests) records the request without sending it, so no task
    waits in a queue that no worker reads.
    """
    if getattr(settings, "CONTROLLER_DISPATCH", True):
        transaction.on_commit(send)


def restart_job(job: Job) -> Job:
    """Ask the controller to run a failed or stopped job again. A job the supervisor gave up on
    resumes every stage from its last primary's checkpoint; a stopped one is planned anew.
    InvalidTransition (409 in the API) for a job that is not failed or stopped."""
    if job.status not in (Job.Status.FAILED, Job.Status.STOPPED):
        raise InvalidTransition(
            f"job {job.pk} is {job.status}: only a failed or stopped job can be restarted"
        )
    dispatch(lambda: tasks.send(tasks.LAUNCH_JOB, job.pk))
    return job


def stop_job(job: Job, reason: str = "stopped by request") -> Job:
    """Ask a job to stop. Idempotent: stopping a stopped job changes nothing."""
    job.request_stop(reason)
    if (
        job.status == Job.Status.STOPPING
        and not job.replicas.exclude(state__in=("stopped", "failed")).exists()
    ):
        # Nothing is running for this job, so there is nothing for the controller to wait for.
        job.mark_stopped(reason)
    return job


def kill_job_processes(job_keys: set[str]) -> int:
    """SIGKILL this machine's stage and generator processes of the given jobs; returns how many.

    For whoever started the node agents on this machine (the demo, the benchmark) and must leave
    nothing behind: stage processes outlive their agent on purpose.
    """
    ended = 0
    for proc in job_processes(job_keys):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
            ended += 1
    return ended


def kill_warm_spares(redis_url: str) -> int:
    """SIGKILL this machine's idle warm spares serving the Backstop at `redis_url`; returns how
    many. For whoever started the node agents here (the demo, the benchmark): spares run in
    sessions of their own, like stage processes, and outlive their agent."""
    ended = 0
    for proc in spare_processes(redis_url=redis_url):
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
            ended += 1
    return ended
