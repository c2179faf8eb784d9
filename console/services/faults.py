"""Asking for a fault and carrying it out: validation, rate limit, the record of who asked,
and FAULT_KINDS, one entry per kind (its target, and how `inject` finds and sends it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
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
    entry = FAULT_KINDS[kind]
    if entry.target is None:
        if target_operator or target_node is not None:
            field = "target_operator" if target_operator else "target_node"
            raise FaultRefused(
                f"{field}: {kind} takes no target (it acts on the job's Kafka broker)",
                field=field,
            )
    elif entry.target == Target.NODE:
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
    if entry.check_request is not None:
        entry.check_request(job)
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


class Target(StrEnum):
    """What a request for a fault names as its target."""

    OPERATOR = "operator"
    NODE = "node"


@dataclass(frozen=True)
class Aimed:
    """A fault ready to go: the detail it is recorded with, and the send that carries it out."""

    detail: str
    send: Callable[[], object]


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault (an entry of FAULT_KINDS).

    target: what a request names (None: the fault acts on what the job uses, no target).
    aim: finds the target of a pending fault and returns it Aimed, or the reason it cannot be
    injected. role: the replica of the operator's stage an operator fault hits.
    check_request: refuses a request for the job beyond its target and params (FaultRefused).
    """

    target: Target | None
    aim: Callable[[FaultInjection], Aimed | str]
    role: str | None = None
    check_request: Callable[[Job], object] | None = None


def _on_operator(aim: Callable[..., Aimed | str], role: str = Replica.Role.PRIMARY) -> FaultKind:
    """A fault of the live `role` replica of an operator's stage; `aim` is given the role."""
    return FaultKind(Target.OPERATOR, partial(aim, role=role), role=role)


def _no_replica(fault: FaultInjection, role: str) -> str:
    return f"no running {role} for operator {fault.target_operator!r}"


def _kill_replica(fault: FaultInjection, role: str) -> Aimed | str:
    replica = _replica_of(fault.job, fault.target_operator, role)
    if replica is None:
        return _no_replica(fault, role)
    return Aimed(
        f"SIGKILL to {replica.local_id} (pid {replica.pid}) on {replica.node.name}",
        partial(
            tasks.send,
            tasks.KILL_REPLICA,
            replica.local_id,
            job_key=fault.job.key,
            queue=node_queue(replica.node.name),
        ),
    )


def _command(fault: FaultInjection, replica: Replica, detail: str, command: dict) -> Aimed:
    """`command` on the replica's control list, fenced with the lease this thread acts under
    (send_command)."""
    return Aimed(
        detail, partial(send_command, redis_client(), fault.job, replica.local_id, command)
    )


def _arm_exception(fault: FaultInjection, role: str) -> Aimed | str:
    replica = _replica_of(fault.job, fault.target_operator, role)
    if replica is None:
        return _no_replica(fault, role)
    return _command(
        fault,
        replica,
        f"armed an exception in the next batch of {replica.local_id}",
        {"cmd": "fault", "kind": "operator_exception", "after_batches": 1},
    )


def _slow_batches(fault: FaultInjection, role: str) -> Aimed | str:
    replica = _replica_of(fault.job, fault.target_operator, role)
    if replica is None:
        return _no_replica(fault, role)
    delay = float(fault.params.get("delay_s", DEFAULT_BATCH_DELAY_S))
    duration = _duration_of(fault)
    return _command(
        fault,
        replica,
        f"each batch of {replica.local_id} {delay:g} s longer for {duration:g} s",
        {"cmd": "fault", "kind": "slow_batches", "delay_s": delay, "duration_s": duration},
    )


def _kill_spark_process(fault: FaultInjection, role: str, process: str) -> Aimed | str:
    replica = _replica_of(fault.job, fault.target_operator, role)
    app = spark_app_of(fault.job, replica)
    if app is None or app.startswith("local-"):
        return (
            f"operator {fault.target_operator!r} has no primary running on a Spark cluster "
            f"(application {app or 'unknown'}): {fault.kind} needs SPARK_MASTER=spark://..."
        )
    # A kill the agent never carries out is failed by `expire_unreported_spark_kills`.
    return Aimed(
        f"SIGKILL to a Spark {process} of application {app} (asked {replica.node.name})",
        partial(
            tasks.send,
            tasks.KILL_SPARK_PROCESS,
            app,
            fault.kind,
            fault_id=fault.pk,
            job_key=fault.job.key,
            queue=node_queue(replica.node.name),
        ),
    )


def _kill_node(fault: FaultInjection) -> Aimed:
    node = fault.target_node.name
    return Aimed(
        f"SIGKILL to every replica of the job on {node}",
        partial(tasks.send, tasks.KILL_NODE, fault.job.key, queue=node_queue(node)),
    )


def _pause_node(fault: FaultInjection) -> Aimed:
    node, duration = fault.target_node.name, _duration_of(fault)
    return Aimed(
        f"SIGSTOP for {duration:g} s on {node}",
        partial(
            tasks.send,
            tasks.PAUSE_NODE,
            duration,
            fault.job.key,
            fault_id=fault.pk,
            queue=node_queue(node),
        ),
    )


def _stress_node(fault: FaultInjection) -> Aimed:
    node, duration = fault.target_node.name, _duration_of(fault)
    workers = int(fault.params.get("workers", DEFAULT_STRESS_WORKERS))
    return Aimed(
        f"{workers} CPU hogs for {duration:g} s on {node}",
        partial(
            tasks.send,
            tasks.STRESS_NODE,
            duration,
            workers,
            fault_id=fault.pk,
            job_key=fault.job.key,
            queue=node_queue(node),
        ),
    )


def _stop_kafka_broker(fault: FaultInjection) -> Aimed | str:
    bootstrap = kafka_bootstrap_of(fault.job)
    if bootstrap is None:
        return "the job uses no Kafka"
    duration = _duration_of(fault)
    hard = bool(fault.params.get("hard", True))
    return Aimed(
        f"{'SIGKILL' if hard else 'SIGTERM'} to the Kafka broker at {bootstrap}, started again "
        f"on its data after {duration:g} s (by the process that keeps it)",
        partial(request_outage, redis_client(), bootstrap, fault.pk, fault.job.key, duration, hard),
    )


def _duration_of(fault: FaultInjection) -> float:
    return float(fault.params.get("duration_s", DEFAULT_DURATION_S))


# Every kind of fault: adding a kind is adding its entry here (and its params in
# console/policy/fault_params.py); tests/console/test_fault_kinds.py checks none is missing.
FAULT_KINDS: dict[str, FaultKind] = {
    FaultInjection.Kind.KILL_DRIVER: _on_operator(_kill_replica),
    FaultInjection.Kind.KILL_STANDBY: _on_operator(_kill_replica, role=Replica.Role.STANDBY),
    FaultInjection.Kind.OPERATOR_EXCEPTION: _on_operator(_arm_exception),
    FaultInjection.Kind.SLOW_DRIVER: _on_operator(_slow_batches),
    FaultInjection.Kind.KILL_EXECUTOR: _on_operator(
        partial(_kill_spark_process, process="executor")
    ),
    FaultInjection.Kind.KILL_WORKER: _on_operator(partial(_kill_spark_process, process="worker")),
    FaultInjection.Kind.KILL_NODE: FaultKind(Target.NODE, _kill_node),
    FaultInjection.Kind.PAUSE_NODE: FaultKind(Target.NODE, _pause_node),
    FaultInjection.Kind.STRESS_NODE: FaultKind(Target.NODE, _stress_node),
    FaultInjection.Kind.KAFKA_BROKER: FaultKind(
        None, _stop_kafka_broker, check_request=check_kafka_broker
    ),
}


def target_of(kind) -> Target | None:
    """What a request for a `kind` fault names as its target (None: it takes none); an
    operator for a value that is no kind, which request_fault then refuses by its kind."""
    entry = FAULT_KINDS.get(kind) if isinstance(kind, str) else None
    return entry.target if entry is not None else Target.OPERATOR


def inject(fault: FaultInjection) -> FaultInjection:
    """Carry out a pending fault through the node agents or the replica's control channel.

    Idempotent: a fault that is no longer pending is left as it is. Its kind's entry in
    FAULT_KINDS finds the target and says what to send. The fault is recorded as injected,
    with its time, just before it is sent: the controller may see the failure it causes at
    once, and the episode it records then finds the fault and measures from its time
    (FaultInjection.behind_failure). A send that fails marks it failed.
    """
    if fault.outcome != FaultInjection.Outcome.PENDING:
        return fault
    entry = FAULT_KINDS.get(fault.kind)
    if entry is None:
        return _finish(fault, FaultInjection.Outcome.FAILED, f"unknown fault kind {fault.kind!r}")
    aimed = entry.aim(fault)
    if isinstance(aimed, str):
        return _finish(fault, FaultInjection.Outcome.FAILED, aimed)
    fault = _finish(fault, FaultInjection.Outcome.INJECTED, aimed.detail)
    try:
        aimed.send()
    except (redis.RedisError, OperationalError) as exc:
        return _finish(fault, FaultInjection.Outcome.FAILED, f"{aimed.detail}: not sent ({exc})")
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
