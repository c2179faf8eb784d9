"""Creating and stopping jobs. The API, the console and management commands all go through here."""

from __future__ import annotations

import contextlib
import os
import signal

import psutil
from django.conf import settings
from django.db import transaction

from console.models import InvalidTransition, Job, Operator, Team
from console.services import audit_log
from console.services.teams import DEFAULT_TEAM
from console.services.topologies import job_topology
from infra import tasks
from infra.processes import job_processes, spare_processes
from spark_runtime import apps, external_io
from spark_runtime.pipelines import input_field_names
from spark_runtime.topology import Topology

# Why a job cannot run in Spark's real-time mode here (the launch refuses it with this).
REALTIME_REFUSAL = (
    "trigger: Spark's real-time mode reads Kafka only through Spark's own Kafka source "
    "(spark-sql-kafka-0-10 at PySpark's version, 4.3.0), which Maven Central does not serve; "
    "Backstop's Kafka source is a Python data source, which real-time mode refuses "
    "(STREAMING_REAL_TIME_MODE.INPUT_STREAM_NOT_SUPPORTED). Use trigger 'microbatch'."
)


class JobRequestError(Exception):
    """The job request is invalid; `field` names the offending input."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


MAX_INT64 = 2**63 - 1


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
        # Bounded: the generator takes them as 64-bit integers.
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT64
        ):
            raise JobRequestError(
                f"params.{name}: must be a whole number in [0, {MAX_INT64}]", "params"
            )
    unknown = sorted(set(cleaned) - {"rate", "count", "seed"})
    if unknown:
        raise JobRequestError(f"params: unknown parameters {unknown}", "params")
    return cleaned


def validate_app_request(
    spec: Topology, args, params: dict | None, source, sink, strategy: str
) -> tuple:
    """`(args, params)` as stored for a job of `spec`: an app's arguments (bounded,
    spark_runtime/apps.py) and its params without a generator (an app reads its own input);
    JobRequestError naming the field for args given to another job, or a generator, Kafka
    source or sink, or a strategy other than restart-all asked of an app."""
    is_app = isinstance(spec.job, apps.AppDefinition)
    if not is_app:
        if args:
            raise JobRequestError("args: only a registered app takes arguments", field="args")
        return [], params
    if strategy != Job.Strategy.RESTART_ALL:
        # A standby is a second copy of the app, writing its output a second time: the app's
        # sinks know nothing of Backstop's fencing.
        raise JobRequestError(
            "strategy: an existing app runs as one copy, under restart-all", field="strategy"
        )
    try:
        args = apps.validate_args(args)
    except apps.AppError as exc:
        raise JobRequestError(str(exc), field="args") from None
    params = {"rate": 0, **(params or {})} if isinstance(params, dict) else params
    if isinstance(params, dict) and params.get("rate"):
        raise JobRequestError(
            "params.rate: an app reads its own input; Backstop generates none for it", "params"
        )
    for name, value in (("source", source), ("sink", sink)):
        if value:
            raise JobRequestError(
                f"{name}: an app reads and writes where its code says (pass paths in args)", name
            )
    return args, params


def validate_io(
    spec: Topology, source: dict | None, sink: dict | None, trigger: str | None
) -> tuple[dict, dict, str]:
    """Check a job's Kafka source and sink and its trigger (JobRequestError naming the field);
    return them as stored on the job ({} where the job uses its own Redis streams)."""
    source, sink = source or {}, sink or {}
    trigger = trigger or Job.Trigger.MICROBATCH
    if trigger not in Job.Trigger.values:
        raise JobRequestError(
            f"trigger: must be one of {', '.join(Job.Trigger.values)}", field="trigger"
        )
    if trigger == Job.Trigger.REALTIME:
        raise JobRequestError(REALTIME_REFUSAL, field="trigger")
    for name, value in (("source", source), ("sink", sink)):
        if not value:
            continue
        if not settings.KAFKA_BOOTSTRAP_SERVERS:
            raise JobRequestError(
                f"{name}: no Kafka cluster is configured (KAFKA_BOOTSTRAP_SERVERS)", field=name
            )
        try:
            if name == "source":
                external_io.parse_source(value, "-", input_field_names(spec))
            else:
                external_io.parse_sink(value, "-")
        except external_io.InvalidExternalIO as exc:
            raise JobRequestError(str(exc), field=name) from None
    return source, sink, trigger


def job_external_io(job: Job, bootstrap: str) -> external_io.ExternalIO:
    """The job's Kafka source and sink on the cluster at `bootstrap`, for its replicas."""
    _ident, spec = job_topology(job.topology)
    return external_io.ExternalIO(
        external_io.parse_source(job.source, bootstrap, input_field_names(spec))
        if job.source
        else None,
        external_io.parse_sink(job.sink, bootstrap) if job.sink else None,
    )


@transaction.atomic
def create_job(
    *,
    name: str,
    topology: str,
    strategy: str,
    params: dict | None,
    user=None,
    source: dict | None = None,
    sink: dict | None = None,
    trigger: str | None = None,
    team: Team | None = None,
    args: list[str] | None = None,
) -> Job:
    """Create a job of `team` and one Operator row per operator of its topology (a built-in one,
    or a registered user job: its newest version unless `NAME@VERSION` is asked for). `source`
    and `sink`: a Kafka topic to read and to write results to (spark_runtime/external_io.py);
    `trigger`: `microbatch` (`realtime` is refused with the reason); `args`: a registered app's
    `sys.argv[1:]`. Who may give a job to which team is console.services.teams.team_for_new_job's
    to say; a job created with no team (a command, a benchmark) is the default team's, so its
    operators see it as they see the demo's."""
    try:
        topology, spec = job_topology(topology)
    except KeyError as exc:
        raise JobRequestError(f"topology: {exc.args[0]}", field="topology") from None
    if strategy not in Job.Strategy.values:
        raise JobRequestError(
            f"strategy: must be one of {', '.join(Job.Strategy.values)}", field="strategy"
        )
    args, params = validate_app_request(spec, args, params, source, sink, strategy)
    source, sink, trigger = validate_io(spec, source, sink, trigger)
    job = Job.objects.create(
        name=name,
        topology=topology,
        strategy=strategy,
        params=validate_params(params or {}),
        args=args,
        source=source,
        sink=sink,
        trigger=trigger,
        team=team or Team.named(DEFAULT_TEAM),
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )
    Operator.objects.bulk_create(Operator.from_spec(job, op, spec) for op in spec.operators)
    dispatch(lambda: tasks.send(tasks.LAUNCH_JOB, job.pk))
    audit_log.record(
        "job.create",
        actor=user,
        target=audit_log.job_target(job),
        detail={"name": name, "topology": topology, "strategy": strategy, "team": str(job.team)},
    )
    return job


def dispatch(send) -> None:
    """Send a controller task once the transaction commits (the worker must see the rows).

    CONTROLLER_DISPATCH=False (unit tests) records the request without sending it, so no task
    waits in a queue that no worker reads.
    """
    if getattr(settings, "CONTROLLER_DISPATCH", True):
        transaction.on_commit(send)


def restart_job(job: Job, user=None) -> Job:
    """Ask the controller to run a failed or stopped job again. A job the supervisor gave up on
    resumes every stage from its last primary's checkpoint; a stopped one is planned anew.
    InvalidTransition (409 in the API) for a job that is not failed or stopped."""
    if job.status not in (Job.Status.FAILED, Job.Status.STOPPED):
        raise InvalidTransition(
            f"job {job.pk} is {job.status}: only a failed or stopped job can be restarted"
        )
    dispatch(lambda: tasks.send(tasks.LAUNCH_JOB, job.pk))
    audit_log.record("job.restart", actor=user, target=audit_log.job_target(job))
    return job


def stop_job(job: Job, reason: str = "stopped by request", user=None) -> Job:
    """Ask a job to stop (`user`: who asks, for the audit log). Idempotent: stopping a stopped
    job changes nothing."""
    job.request_stop(reason)
    audit_log.record(
        "job.stop", actor=user, target=audit_log.job_target(job), detail={"reason": reason}
    )
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
    nothing behind: stage processes outlive their agent on purpose. A process that leads its
    own process group (every stage and generator starts in a session of its own,
    spark_runtime/launch.py) is killed with its group: its Spark JVM and the JVM's Python
    workers, which a kill of the driver alone left running (a Kafka source's runner outlived
    `bin/demo --check`).
    """
    ended = 0
    for proc in job_processes(job_keys):
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
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
