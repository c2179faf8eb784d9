"""Asking for a fault: validation, rate limit, and the record of who asked."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from functools import partial

import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from kombu.exceptions import OperationalError

from console.clock import utc
from console.models import ControlDecision, FaultInjection, Job, Node, RecoveryEpisode, Replica
from console.policy.fault_params import (
    DEFAULT_BATCH_DELAY_S,
    DEFAULT_DURATION_S,
    DEFAULT_MAX_DURATION_S,
    DEFAULT_STRESS_WORKERS,
    FaultParamsError,
    Limits,
    validate_params,
)
from console.redis import redis_client
from console.services import audit_log
from console.services.control.commands import send_command
from console.services.jobs import dispatch
from infra import keys, tasks
from infra.kafka_outage import ASKED, DOWN, OutageRefused, outage, registration, request_outage
from infra.queues import node_queue
from spark_runtime import external_io
from spark_runtime import keys as data_keys


class FaultRefused(Exception):
    """The fault cannot be injected; `field` names the offending input when there is one."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.field = field
        self.status = status


def fault_rate_limit_per_minute() -> int:
    return getattr(settings, "FAULT_RATE_LIMIT_PER_MINUTE", 6)


def fault_max_duration_s() -> float:
    """The longest pause or stress a fault may ask for (settings FAULT_MAX_DURATION_S)."""
    return float(getattr(settings, "FAULT_MAX_DURATION_S", DEFAULT_MAX_DURATION_S))


def node_cores(node: Node | None) -> float | None:
    """The cores of `node`: from its agent's latest sample in Redis, else its registration."""
    if node is None:
        return None
    try:
        latest = redis_client().get(keys.node_heartbeat(node.name))
    except redis.RedisError:
        latest = None
    if latest:
        try:
            return float(json.loads(latest)["cpu_total"])
        except (ValueError, KeyError, TypeError):
            pass  # a malformed sample: fall back to the registered capacity
    return node.cpu_total


def fault_limits(node: Node | None) -> Limits:
    """The bounds of a fault's params on `node` (see console.policy.fault_params)."""
    return Limits(max_duration_s=fault_max_duration_s(), cores=node_cores(node))


def request_fault(
    job: Job,
    kind: str,
    *,
    target_operator: str = "",
    target_node: Node | None = None,
    params: dict | None = None,
    requested_by=None,
) -> FaultInjection:
    """Validate and record a fault request; the controller injects pending faults.

    Refuses params that the kind does not accept or that exceed the target node's bounds (400,
    see console.policy.fault_params), faults on jobs that are not running (409), unknown
    operators or missing nodes (400), and more than `FAULT_RATE_LIMIT_PER_MINUTE` faults per job
    per minute (429). A kafka-broker fault takes no target, and is refused for a job that uses
    no Kafka or whose Kafka is not a broker Backstop runs (400; `check_kafka_broker`).
    """
    if kind not in FaultInjection.Kind.values:
        raise FaultRefused(f"kind: unknown fault kind {kind!r:.60}", field="kind")
    if job.status != Job.Status.RUNNING:
        raise FaultRefused(
            f"job {job.name!r} is {job.status}; faults can only be injected into running jobs",
            status=409,
        )
    if kind in FaultInjection.UNTARGETED_KINDS:
        if target_operator or target_node is not None:
            field = "target_operator" if target_operator else "target_node"
            raise FaultRefused(
                f"{field}: {kind} takes no target (it acts on the job's Kafka broker)",
                field=field,
            )
    elif kind in FaultInjection.NODE_KINDS:
        if target_node is None:
            raise FaultRefused(f"target_node: {kind} needs a node", field="target_node")
    else:
        if not target_operator:
            raise FaultRefused(
                f"target_operator: {kind} needs an operator", field="target_operator"
            )
        if not job.operators.filter(name=target_operator).exists():
            raise FaultRefused(
                f"target_operator: job {job.name!r} has no operator {target_operator!r}",
                field="target_operator",
            )
    try:
        params = validate_params(kind, params, fault_limits(target_node))
    except FaultParamsError as exc:
        raise FaultRefused(str(exc), field="params") from exc
    if kind == FaultInjection.Kind.KAFKA_BROKER:
        check_kafka_broker(job)
    recent = job.faults.filter(requested_at__gte=timezone.now() - timedelta(minutes=1)).count()
    if recent >= fault_rate_limit_per_minute():
        raise FaultRefused(
            f"rate limit: at most {fault_rate_limit_per_minute()} faults per job per minute",
            status=429,
        )
    fault = FaultInjection.objects.create(
        job=job,
        kind=kind,
        target_operator=target_operator,
        target_node=target_node,
        params=params,
        requested_by=requested_by if getattr(requested_by, "is_authenticated", False) else None,
    )
    dispatch(lambda: tasks.send(tasks.INJECT_FAULT, fault.pk))
    audit_log.record(
        "fault.inject",
        actor=requested_by,
        target=audit_log.job_target(job),
        detail={
            "fault": fault.pk,
            "kind": kind,
            "target_operator": target_operator,
            "target_node": target_node.name if target_node else "",
            "params": params,
        },
    )
    return fault


def kafka_bootstrap_of(job: Job) -> str | None:
    """The Kafka cluster the job's replicas use, as recorded at its launch (None: no Kafka)."""
    io = external_io.load(redis_client(), job.key)
    used = io.source or io.sink
    return used.bootstrap if used is not None else None


def check_kafka_broker(job: Job) -> str:
    """The address of the job's Kafka broker when a kafka-broker fault may stop it: the job
    reads or writes Kafka, the broker there is one Backstop started and keeps (registered by
    its keeper, infra/kafka_outage.py), and no outage of it is under way. FaultRefused with
    the reason otherwise."""
    bootstrap = kafka_bootstrap_of(job)
    if bootstrap is None:
        raise FaultRefused(
            f"kind: kafka-broker stops the Kafka broker of a job on Kafka; job {job.name!r} "
            "reads and writes Backstop's Redis streams only",
            field="kind",
        )
    if registration(redis_client(), bootstrap) is None:
        raise FaultRefused(
            f"kind: kafka-broker is refused: the Kafka cluster at {bootstrap} is not a broker "
            "Backstop started and keeps (a cluster given by KAFKA_BOOTSTRAP_SERVERS, or a "
            "broker whose owner is gone); Backstop stops and starts only its own broker",
            field="kind",
        )
    current = outage(redis_client(), bootstrap)
    if current is not None and current.state in (ASKED, DOWN):
        raise FaultRefused(
            f"the Kafka broker at {bootstrap} is already {current.state} for fault "
            f"#{current.fault}: one outage at a time",
            status=409,
        )
    return bootstrap


def _replica_of(job: Job, operator: str, role: str):
    """The live replica of the stage that runs `operator`, in `role`."""
    stage = job.operators.filter(name=operator).values_list("stage", flat=True).first()
    return (
        Replica.objects.filter(job=job, stage=stage, role=role)
        .exclude(state__in=(Replica.State.FAILED, Replica.State.STOPPED))
        .select_related("node")
        .order_by("-started_at")
        .first()
    )


def inject(fault: FaultInjection) -> FaultInjection:
    """Carry out a pending fault through the node agents or the replica's control channel.

    Idempotent: a fault that is no longer pending is left as it is. The fault is recorded as
    injected, with its time, just before it is sent: the controller may see the failure it
    causes at once, and the episode it records then finds the fault and measures from its time
    (FaultInjection.behind_failure). A send that fails marks it failed.
    """
    if fault.outcome != FaultInjection.Outcome.PENDING:
        return fault
    job = fault.job
    duration = float(fault.params.get("duration_s", DEFAULT_DURATION_S))
    if fault.kind in (FaultInjection.Kind.KILL_DRIVER, FaultInjection.Kind.KILL_STANDBY):
        role = "primary" if fault.kind == FaultInjection.Kind.KILL_DRIVER else "standby"
        replica = _replica_of(job, fault.target_operator, role)
        if replica is None:
            return _finish(
                fault,
                FaultInjection.Outcome.FAILED,
                f"no running {role} for operator {fault.target_operator!r}",
            )
        local_id = replica.local_id
        detail = f"SIGKILL to {local_id} (pid {replica.pid}) on {replica.node.name}"
        send = partial(
            tasks.send,
            tasks.KILL_REPLICA,
            local_id,
            job_key=job.key,
            queue=node_queue(replica.node.name),
        )
    elif fault.kind in (FaultInjection.Kind.OPERATOR_EXCEPTION, FaultInjection.Kind.SLOW_DRIVER):
        replica = _replica_of(job, fault.target_operator, "primary")
        if replica is None:
            return _finish(
                fault,
                FaultInjection.Outcome.FAILED,
                f"no running primary for operator {fault.target_operator!r}",
            )
        local_id = replica.local_id
        if fault.kind == FaultInjection.Kind.OPERATOR_EXCEPTION:
            detail = f"armed an exception in the next batch of {local_id}"
            command = {"cmd": "fault", "kind": "operator_exception", "after_batches": 1}
        else:
            delay = float(fault.params.get("delay_s", DEFAULT_BATCH_DELAY_S))
            detail = f"each batch of {local_id} {delay:g} s longer for {duration:g} s"
            command = {"cmd": "fault", "kind": "slow_batches", "delay_s": delay,
                       "duration_s": duration}  # fmt: skip
        send = partial(send_command, redis_client(), job, local_id, command)
    elif fault.kind in (FaultInjection.Kind.KILL_EXECUTOR, FaultInjection.Kind.KILL_WORKER):
        replica = _replica_of(job, fault.target_operator, "primary")
        app = spark_app_of(job, replica)
        if app is None or app.startswith("local-"):
            return _finish(
                fault,
                FaultInjection.Outcome.FAILED,
                f"operator {fault.target_operator!r} has no primary running on a Spark cluster "
                f"(application {app or 'unknown'}): {fault.kind} needs SPARK_MASTER=spark://...",
            )
        what = "worker" if fault.kind == FaultInjection.Kind.KILL_WORKER else "executor"
        detail = f"SIGKILL to a Spark {what} of application {app} (asked {replica.node.name})"
        # A kill the agent never carries out is failed by `expire_unreported_spark_kills`.
        send = partial(
            tasks.send,
            tasks.KILL_SPARK_PROCESS,
            app,
            fault.kind,
            fault_id=fault.pk,
            job_key=job.key,
            queue=node_queue(replica.node.name),
        )
    elif fault.kind == FaultInjection.Kind.KILL_NODE:
        detail = f"SIGKILL to every replica of the job on {fault.target_node.name}"
        send = partial(
            tasks.send, tasks.KILL_NODE, job.key, queue=node_queue(fault.target_node.name)
        )
    elif fault.kind == FaultInjection.Kind.PAUSE_NODE:
        detail = f"SIGSTOP for {duration:g} s on {fault.target_node.name}"
        send = partial(
            tasks.send,
            tasks.PAUSE_NODE,
            duration,
            job.key,
            fault_id=fault.pk,
            queue=node_queue(fault.target_node.name),
        )
    elif fault.kind == FaultInjection.Kind.KAFKA_BROKER:
        bootstrap = kafka_bootstrap_of(job)
        if bootstrap is None:
            return _finish(fault, FaultInjection.Outcome.FAILED, "the job uses no Kafka")
        hard = bool(fault.params.get("hard", True))
        how = "SIGKILL" if hard else "SIGTERM"
        detail = (
            f"{how} to the Kafka broker at {bootstrap}, started again on its data after "
            f"{duration:g} s (by the process that keeps it)"
        )
        send = partial(request_outage, redis_client(), bootstrap, fault.pk, job.key, duration, hard)
    elif fault.kind == FaultInjection.Kind.STRESS_NODE:
        workers = int(fault.params.get("workers", DEFAULT_STRESS_WORKERS))
        detail = f"{workers} CPU hogs for {duration:g} s on {fault.target_node.name}"
        send = partial(
            tasks.send,
            tasks.STRESS_NODE,
            duration,
            workers,
            fault_id=fault.pk,
            job_key=job.key,
            queue=node_queue(fault.target_node.name),
        )
    else:
        return _finish(fault, FaultInjection.Outcome.FAILED, f"unknown fault kind {fault.kind!r}")
    fault = _finish(fault, FaultInjection.Outcome.INJECTED, detail)
    try:
        send()
    except (redis.RedisError, OperationalError) as exc:
        return _finish(fault, FaultInjection.Outcome.FAILED, f"{detail}: not sent ({exc})")
    except OutageRefused as exc:
        return _finish(fault, FaultInjection.Outcome.REFUSED, str(exc))
    return fault


def spark_app_of(job: Job, replica) -> str | None:
    """The Spark application id the replica's stage process reported (None: not known yet)."""
    if replica is None:
        return None
    raw = redis_client().hget(data_keys.replicas(job.key), replica.local_id)
    return json.loads(raw).get("spark_app") if raw else None


# How long an agent has to report a kill-executor or kill-worker it was sent (its task expires
# after 30 s in the queue).
SPARK_KILL_REPORT_TIMEOUT_S = 60.0


@transaction.atomic
def record_spark_kill(job: Job, fault_id: str, detail: str, at: float) -> RecoveryEpisode | None:
    """A node agent killed a Spark executor or worker for the fault at `at` (epoch s): the
    stage's process lives on and Spark runs the lost tasks again, so no Backstop action follows;
    an episode is opened so the output gap is measured and audited like any other. Idempotent:
    one such episode a fault (the fault row is locked while it is checked)."""
    fault = FaultInjection.objects.select_for_update().filter(pk=int(fault_id), job=job).first()
    if fault is None or fault.episodes.filter(action=RecoveryEpisode.Action.SPARK_RETRY).exists():
        return None
    stage = job.operators.filter(name=fault.target_operator).values_list("stage", flat=True).first()
    episode = RecoveryEpisode.objects.create(
        job=job,
        fault=fault,
        strategy=job.strategy,
        stage=stage or "",
        action=RecoveryEpisode.Action.SPARK_RETRY,
        detected_at=utc(at),
        notes=detail,
    )
    fault.outcome_detail = f"{fault.outcome_detail}; {detail}"
    fault.save(update_fields=["outcome_detail"])
    return episode


def expire_unreported_spark_kills(job: Job | None = None, now: datetime | None = None) -> int:
    """kill-executor and kill-worker faults (of `job`, or of every job) whose agent reported
    nothing within SPARK_KILL_REPORT_TIMEOUT_S (it was down, or the task expired in its queue)
    are marked failed: nothing else would show whether they happened. Returns how many. The
    watchdog runs it for every job at once (one query while none is due)."""
    now = now or timezone.now()
    faults = FaultInjection.objects.all() if job is None else job.faults
    silent = faults.filter(
        kind__in=(FaultInjection.Kind.KILL_EXECUTOR, FaultInjection.Kind.KILL_WORKER),
        outcome=FaultInjection.Outcome.INJECTED,
        injected_at__lt=now - timedelta(seconds=SPARK_KILL_REPORT_TIMEOUT_S),
    ).exclude(episodes__action=RecoveryEpisode.Action.SPARK_RETRY)
    expired = 0
    for fault in silent:
        fault.outcome = FaultInjection.Outcome.FAILED
        fault.outcome_detail += (
            f"; no report from the node agent within {SPARK_KILL_REPORT_TIMEOUT_S:g} s"
        )
        fault.save(update_fields=["outcome", "outcome_detail"])
        expired += 1
    return expired


def record_refusal(job, fault_id: str, detail: str) -> FaultInjection | None:
    """The node agent refused the fault after it was sent (its own bounds are stricter): the
    fault was not injected after all. Idempotent; a fault of another job is left alone."""
    fault = FaultInjection.objects.filter(pk=int(fault_id), job=job).first()
    if fault is None or fault.outcome == FaultInjection.Outcome.REFUSED:
        return fault
    return _finish(fault, FaultInjection.Outcome.REFUSED, f"refused by the node agent: {detail}")


def _finish(fault: FaultInjection, outcome: str, detail: str) -> FaultInjection:
    fault.outcome = outcome
    fault.outcome_detail = detail
    fault.injected_at = timezone.now() if outcome == FaultInjection.Outcome.INJECTED else None
    fault.save(update_fields=["outcome", "outcome_detail", "injected_at"])
    ControlDecision.objects.create(
        job=fault.job,
        kind=ControlDecision.Kind.FAULT,
        operator=fault.target_operator,
        node=fault.target_node.name if fault.target_node else "",
        reason=f"{fault.kind} {outcome}: {detail}",
        detail={"fault": fault.pk},
    )
    return fault
