"""Upgrading a running job blue/green: the request, the state check, and the controller's part.

The switching itself is spark_runtime/upgrade.py's (events -> actions in the job's supervisor);
this module is what is around it:

1. `request_upgrade` (API, console, `manage.py upgrade_job`): checks what can be checked at once
   (the job runs, one upgrade at a time, the target is a version of the job's topology with the
   same operators, something changes) and records a JobUpgrade, `requested`; a controller task
   runs `check_upgrade`.
2. `check_upgrade`: the dry run of the new version on a copy of the running primary's checkpoint
   (spark_runtime/upgrade_check.py, in a child process: it needs a SparkSession) decides the
   case: `seeded` (the state is compatible), `rebuild` (it is not, and the job's input stream
   still holds everything since the job started, so the new version rebuilds its state from it),
   or `refused` (the state is incompatible and the input before some time is gone, or Spark
   refuses the new version whatever the state), with the reason in plain words. Nothing has
   started yet; a refused upgrade ends there. Else the job's controller is woken.
3. `reconcile_upgrade`, in the job's reconcile (console.services.controller): starts green once
   the case is known, carries out a confirm or rollback asked by hand, confirms by itself once
   green has written for the policy's `upgrade_validation_s`, and copies the supervisor's phase
   to the record (and the job's version to the Job row at the switch and back at a rollback).

Every write of a record is a compare-and-set on its status (`filter(pk=..., status=...)
.update(...)`) of the fields its writer owns, never a save of a whole copy read earlier: an
operator's confirm or rollback (`requested_action`, `ended_by`) cannot be overwritten by a
reconcile that read the record before it, and a cancel before the start cannot be overwritten
by the state check's refusal or the controller's start. The loser of a race leaves the record
alone; the controller's next reconcile sees what won (every reconcile looks at a job with an
upgrade under way, console.services.fleet).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.clock import utc
from console.models import ControlDecision, Job, JobUpgrade, Policy, Replica
from console.policy.recovery import latency_limit_ms, p90_per_second_ms
from console.redis import redis_client
from console.services import audit_log
from console.services.control.act import checkpoint_root
from console.services.control.observe import load_supervisor
from console.services.control.record import decide
from console.services.jobs import dispatch
from console.services.recovery import PROGRESS_READ_LIMIT, recovery_settings
from console.services.topologies import job_topology
from infra import keys as control_keys
from infra import leases, tasks
from spark_runtime import keys as data_keys
from spark_runtime import upgrade as upgrades
from spark_runtime import upgrade_check
from spark_runtime.apps import AppDefinition
from spark_runtime.progress import read_progress
from spark_runtime.replicas import FAILED, PRIMARY, RUNNING, KillReplica
from spark_runtime.strategies import STRATEGIES, get_strategy, in_place_refusal
from spark_runtime.supervision import Supervisor

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 120.0  # the dry run's own wait for a batch, plus a SparkSession's start
# After this long without a verdict no check can write one: its task expires unstarted in the
# queue after CHECK_UPGRADE.expires_s, and a started one is killed at CHECK_TIMEOUT_S + 60
# (workers/controller.py); a minute's margin on top.
CHECK_DEADLINE_S = tasks.CHECK_UPGRADE.expires_s + CHECK_TIMEOUT_S + 120
# What the record says in each phase of the supervisor's upgrade.
STATUS_OF_PHASE = {
    upgrades.STARTING: JobUpgrade.Status.STARTING,
    upgrades.HANDING_OVER: JobUpgrade.Status.SWITCHING,
    upgrades.SWITCHING: JobUpgrade.Status.SWITCHING,
    upgrades.VALIDATING: JobUpgrade.Status.VALIDATING,
    upgrades.CONFIRMED: JobUpgrade.Status.CONFIRMED,
    upgrades.ROLLED_BACK: JobUpgrade.Status.ROLLED_BACK,
    upgrades.ABANDONED: JobUpgrade.Status.ABANDONED,
}
CONFIRM, ROLLBACK = "confirm", "rollback"
# The longest operator parameter value accepted: values are numbers and short names, and each
# one goes on the command line of the dry run and of every replica started with it (a value of
# 128 KiB made the dry run's exec fail, E2BIG).
PARAM_VALUE_MAX_CHARS = 256


class UpgradeRequestError(Exception):
    """The upgrade cannot be asked for; `field` names the input at fault, `status` the HTTP
    status the API answers with."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.field = field
        self.status = status


def base_name(topology: str) -> str:
    """`activity@2` -> `activity`; a built-in topology's name is its own."""
    return topology.split("@", 1)[0]


def validate_params(topology_spec, params: dict | None) -> dict[str, str]:
    """Operator parameters `{"OP.KEY": value}` of an upgrade, checked against the operators'
    parameters (spark_runtime/topology.py: each operator's `params`)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise UpgradeRequestError('params: must be an object {"OPERATOR.KEY": value}', "params")
    known = {f"{op.name}.{key}" for op in topology_spec.operators for key in op.params}
    cleaned = {}
    for name, value in params.items():
        if name not in known:
            choices = ", ".join(sorted(known)) or "none"
            raise UpgradeRequestError(
                f"params: {name[:80]!r} is not a parameter of this job's operators (they have: "
                f"{choices})",
                "params",
            )
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise UpgradeRequestError(f"params: {name!r} must be a number or a string", "params")
        text = str(value)
        if len(text) > PARAM_VALUE_MAX_CHARS:
            raise UpgradeRequestError(
                f"params: {name!r} is {len(text)} characters long; a value has at most "
                f"{PARAM_VALUE_MAX_CHARS}",
                "params",
            )
        cleaned[name] = text
    return cleaned


def as_cli_params(params: dict[str, str]) -> tuple[str, ...]:
    """{"OP.KEY": "V"} -> ("OP.KEY=V", ...), the stage CLI's form."""
    return tuple(f"{name}={value}" for name, value in sorted(params.items()))


@transaction.atomic
def request_upgrade(
    job: Job,
    *,
    topology: str | None = None,
    params: dict | None = None,
    user=None,
    mode: str = JobUpgrade.Mode.BLUE_GREEN,
    strategy: str | None = None,
    result_preserving: bool = False,
) -> JobUpgrade:
    """Ask for an upgrade of the running `job` to `topology` (a version of its topology, default
    its own) with operator parameters `params`, blue/green or (`mode` stop_restart, the
    baseline) stopped and restarted; or, on its own, to another fault-tolerance `strategy`
    (changed in place where it cuts the job into the same stages). `result_preserving`: the
    new version computes the same results, checked against the old one's while validating (a
    blue/green upgrade's). Raises UpgradeRequestError naming the field."""
    if strategy is not None and strategy not in STRATEGIES:
        raise UpgradeRequestError(f"strategy: must be one of {', '.join(STRATEGIES)}", "strategy")
    if mode not in JobUpgrade.Mode.values:
        raise UpgradeRequestError(
            f"mode: must be one of {', '.join(JobUpgrade.Mode.values)}", "mode"
        )
    if is_app(job.topology):
        # A second copy of an app (the new version, or a standby) would write its output
        # twice: the app's sinks know nothing of Backstop's fencing. Its one copy stops and
        # the new version starts from the same checkpoints (spark_runtime/upgrade.py).
        if strategy is not None and strategy != job.strategy:
            raise UpgradeRequestError(
                "strategy: an existing app runs as one copy under restart-all; its strategy "
                "does not change",
                "strategy",
            )
        if result_preserving:
            raise UpgradeRequestError(
                "result_preserving: an app's old version does not run beside the new one, so "
                "there are no results to compare",
                "result_preserving",
            )
        mode = JobUpgrade.Mode.STOP_RESTART  # the only way an app is upgraded
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.status != Job.Status.RUNNING:
        raise UpgradeRequestError(
            f"job {job.name!r} is {job.status}: only a running job is upgraded", status=409
        )
    if job.upgrades.filter(status__in=JobUpgrade.UNDER_WAY).exists():
        raise UpgradeRequestError(
            f"job {job.name!r} has an upgrade under way; confirm or roll it back first",
            status=409,
        )
    target = topology or job.topology
    if base_name(target) != base_name(job.topology):
        raise UpgradeRequestError(
            f"topology: {target!r} is not a version of the job's topology "
            f"{base_name(job.topology)!r}",
            "topology",
        )
    try:
        target, target_spec = job_topology(target)
        _, current_spec = job_topology(job.topology)
    except KeyError as exc:
        raise UpgradeRequestError(f"topology: {exc.args[0]}", "topology") from None
    current_ops = [(op.name, op.kind) for op in current_spec.operators]
    target_ops = [(op.name, op.kind) for op in target_spec.operators]
    if current_ops != target_ops:
        raise UpgradeRequestError(
            f"topology: {target} has other operators than {job.topology} "
            f"({target_ops} against {current_ops}); an upgrade keeps the operators (a new "
            "job runs a changed chain)",
            "topology",
        )
    current_params = current_upgrade_params(job)
    new_strategy = strategy or job.strategy
    # A strategy change alone keeps the parameters in force (given none, a new version runs
    # with its own).
    strategy_only = new_strategy != job.strategy and params is None and target == job.topology
    cleaned = current_params if strategy_only else validate_params(target_spec, params)
    version_changes = target != job.topology or cleaned != current_params
    if new_strategy != job.strategy and version_changes:
        raise UpgradeRequestError(
            "strategy: change the strategy in an upgrade of its own (this one also changes "
            "the version or the params)",
            "strategy",
        )
    if not version_changes and new_strategy == job.strategy:
        raise UpgradeRequestError(
            "nothing to change: give another version (topology), other params or another strategy"
        )
    if result_preserving and (not version_changes or mode != JobUpgrade.Mode.BLUE_GREEN):
        raise UpgradeRequestError(
            "result_preserving: only a blue/green upgrade to another version or other params "
            "has results to check (the old version computes beside the new one)",
            "result_preserving",
        )
    upgrade = JobUpgrade.objects.create(
        job=job,
        requested_by=user if getattr(user, "is_authenticated", False) else None,
        from_topology=job.topology,
        to_topology=target,
        from_params=current_params,
        to_params=cleaned,
        from_strategy=job.strategy,
        to_strategy=new_strategy,
        mode=mode,
        result_preserving=result_preserving,
    )
    who = upgrade.requested_by.get_username() if upgrade.requested_by else "the system"
    change = (
        f"strategy {job.strategy} -> {new_strategy}"
        if not version_changes
        else f"{upgrade.from_topology} -> {target}"
        + (f" with {', '.join(as_cli_params(cleaned))}" if cleaned else "")
        + f" ({mode.replace('_', '/')})"
        + (", declared result-preserving" if result_preserving else "")
    )
    decide(job, ControlDecision.Kind.UPGRADE, f"upgrade {upgrade.pk} requested by {who}: {change}")
    dispatch(lambda: tasks.send(tasks.CHECK_UPGRADE, upgrade.pk))
    audit_log.record(
        "upgrade.start" if version_changes else "strategy.change",
        actor=user,
        target=audit_log.job_target(job),
        detail={"upgrade": upgrade.pk, "change": change},
    )
    return upgrade


def is_app(topology: str) -> bool:
    """Whether `topology` (NAME@VERSION) is an existing app (spark_runtime/apps.py)."""
    return isinstance(job_topology(topology)[1].job, AppDefinition)


def current_upgrade_params(job: Job) -> dict[str, str]:
    """The operator parameters the job runs with: those of its last confirmed upgrade."""
    last = job.upgrades.filter(status=JobUpgrade.Status.CONFIRMED).order_by("-ended_at").first()
    return dict(last.to_params) if last else {}


@transaction.atomic
def request_end(upgrade: JobUpgrade, action: str, user=None) -> JobUpgrade:
    """Ask the job's controller to confirm or roll back `upgrade` now (a rollback until the
    upgrade is confirmed, a confirm once the new version writes)."""
    upgrade = JobUpgrade.objects.select_for_update().get(pk=upgrade.pk)
    if action not in (CONFIRM, ROLLBACK):
        raise UpgradeRequestError("action: must be confirm or rollback", "action")
    if not upgrade.under_way:
        raise UpgradeRequestError(f"upgrade {upgrade.pk} has ended ({upgrade.status})", status=409)
    if action == CONFIRM and upgrade.status != JobUpgrade.Status.VALIDATING:
        raise UpgradeRequestError(
            f"upgrade {upgrade.pk} is {upgrade.status}: it can be confirmed once the new "
            "version writes the output",
            status=409,
        )
    by = user if getattr(user, "is_authenticated", False) else None
    records = JobUpgrade.objects.filter(pk=upgrade.pk)
    if action == ROLLBACK and upgrade.status == JobUpgrade.Status.REQUESTED:
        # Nothing has started (the state check may still run): cancelled here and now, unless
        # the controller started it meanwhile (then the rollback is passed on, below).
        outcome = f"cancelled before it started by {by.get_username() if by else 'an operator'}"
        cancelled = records.filter(status=JobUpgrade.Status.REQUESTED).update(
            status=JobUpgrade.Status.ABANDONED,
            ended_at=timezone.now(),
            outcome=outcome,
            requested_action="",
            ended_by=by,
        )
        if cancelled:
            upgrade.refresh_from_db()
            _record_end(upgrade, action, by)
            return upgrade
    # Only the fields the operator owns, and only while the upgrade can still take the request:
    # the controller carries it out at its next reconcile.
    can_take = (
        records.filter(status=JobUpgrade.Status.VALIDATING)
        if action == CONFIRM
        else records.filter(status__in=JobUpgrade.UNDER_WAY)
    )
    if not can_take.update(requested_action=action, ended_by=by):
        upgrade.refresh_from_db()
        raise UpgradeRequestError(f"upgrade {upgrade.pk} has ended ({upgrade.status})", status=409)
    upgrade.refresh_from_db()
    transaction.on_commit(lambda: wake(upgrade.job))
    _record_end(upgrade, action, by)
    return upgrade


def _record_end(upgrade: JobUpgrade, action: str, user) -> None:
    audit_log.record(
        f"upgrade.{action}",
        actor=user,
        target=audit_log.job_target(upgrade.job),
        detail={"upgrade": upgrade.pk},
    )


def wake(job: Job, client=None) -> None:
    """Have the job's controller reconcile it at once (it reads the agent events stream)."""
    own = client is None
    client = client or redis_client()
    try:
        client.xadd(
            control_keys.agent_events(),
            {"job": job.key, "kind": control_keys.EVENT_UPGRADE},
            maxlen=control_keys.AGENT_EVENTS_MAXLEN,
            approximate=True,
        )
    finally:
        if own:
            client.close()


# --- the state check (a controller task) -------------------------------------------------------


def check_upgrade(upgrade: JobUpgrade, client, runner: str = "") -> JobUpgrade:
    """Decide the upgrade's case by a dry run; refuse it, or wake the job's controller.
    `runner`: the controller process running the check (its fleet owner name), said in Redis
    while it runs, so that the job's reconcile sends the check again if that process dies."""
    if upgrade.status != JobUpgrade.Status.REQUESTED:
        return upgrade  # started, ended or cancelled meanwhile
    if upgrade.case:
        wake(upgrade.job, client)  # checked already (a task run twice): wake again, harmless
        return upgrade
    runner_key = control_keys.upgrade_check_runner(upgrade.job.key, upgrade.pk)
    if runner:
        client.set(runner_key, runner, ex=round(CHECK_DEADLINE_S))
    try:
        return _check(upgrade, client)
    finally:
        if runner and client.get(runner_key) == runner:
            client.delete(runner_key)


def _check(upgrade: JobUpgrade, client) -> JobUpgrade:
    """check_upgrade's dry run and verdict."""
    job = upgrade.job
    supervisor = load_supervisor(client, job)
    if upgrade.changes_strategy:
        return check_strategy_change(upgrade, supervisor, client)
    if is_app(upgrade.to_topology):
        return check_app_upgrade(upgrade, supervisor, client)
    changed = {name.split(".", 1)[0] for name in upgrade.to_params}
    try:
        stage, blue = stage_to_upgrade(supervisor, changed)
    except UpgradeRequestError as exc:
        return refuse(upgrade, "", str(exc))
    if blue is None:
        return refuse(upgrade, stage or "", "the job has no running primary to upgrade from")
    try:
        verdict = dry_run(upgrade, supervisor, stage, blue)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        # The check could not run or said nothing readable (a command line too long, an
        # output that is no verdict): without a verdict the upgrade cannot start, and left
        # `requested` it would block every later upgrade of the job.
        return refuse(upgrade, stage, f"the state check failed: {type(exc).__name__}: {exc}")
    case, reason = decide_case(job, upgrade, stage, verdict, client)
    upgrade.stage, upgrade.case, upgrade.reason = stage, case, reason
    upgrade.checkpoint_batch = verdict.get("batch")
    if case == JobUpgrade.Case.REBUILD and upgrade.mode == JobUpgrade.Mode.STOP_RESTART:
        case, reason = (
            JobUpgrade.Case.REFUSED,
            (
                f"{reason}; a stop-and-restart upgrade restarts from the checkpoint, which this "
                "state rules out"
            ),
        )
    if case == JobUpgrade.Case.REFUSED:
        return refuse(upgrade, stage, reason)
    if not record_case(upgrade):
        return upgrade
    wake(job, client)
    return upgrade


def record_case(upgrade: JobUpgrade) -> bool:
    """Write the case the state check decided (stage, case, reason, batch) if the upgrade is
    still requested and unchecked: a cancel meanwhile, or a twin run of the task, wins."""
    written = JobUpgrade.objects.filter(
        pk=upgrade.pk, status=JobUpgrade.Status.REQUESTED, case=""
    ).update(
        stage=upgrade.stage,
        case=upgrade.case,
        reason=upgrade.reason,
        checkpoint_batch=upgrade.checkpoint_batch,
    )
    if not written:
        upgrade.refresh_from_db()
    return bool(written)


def check_app_upgrade(upgrade: JobUpgrade, supervisor: Supervisor | None, client):
    """An app has no dry run: only its own code knows its queries, and starting a copy of it
    would run its sinks. Its case is APP_RESTART once it runs; Spark's own rules judge its
    checkpoints when the new version starts on them (a failure there rolls back)."""
    stage, app = stage_to_upgrade(supervisor)
    if app is None:
        return refuse(upgrade, stage or "", "the app is not running: nothing to upgrade")
    upgrade.stage, upgrade.case = stage, JobUpgrade.Case.APP_RESTART
    upgrade.reason = (
        f"an app is upgraded by a stop and a start: {app} stops its queries, then "
        f"{upgrade.to_topology} starts from the same checkpoints, where Spark decides whether "
        f"they suit it; confirmed once each of its queries has completed a batch, rolled back "
        f"(the old version restarts from the checkpoints) if it fails first or they have not "
        f"within {upgrades.APP_FIRST_BATCHES_WITHIN_S:g} s of its start"
    )
    if not record_case(upgrade):
        return upgrade
    wake(upgrade.job, client)
    return upgrade


def check_strategy_change(upgrade: JobUpgrade, supervisor: Supervisor | None, client):
    """A strategy change is made in place where the new strategy cuts the job into the stages
    it runs as (spark_runtime.strategies.in_place_refusal), else refused with the two cuts."""
    if supervisor is None:
        return refuse(upgrade, "", "the job has no supervision state to change")
    _, spec = job_topology(upgrade.job.topology)
    refusal = in_place_refusal(
        spec, supervisor.stage_operators, supervisor.active_stages, upgrade.to_strategy
    )
    if refusal is not None:
        return refuse(upgrade, "", refusal)
    upgrade.case = JobUpgrade.Case.IN_PLACE
    upgrade.reason = (
        f"{upgrade.from_strategy} and {upgrade.to_strategy} cut this job into the same stages "
        f"({', '.join(supervisor.stages)}): every replica and its checkpoint go on, and the "
        f"job is protected as {get_strategy(upgrade.to_strategy).label} from now on"
    )
    if not record_case(upgrade):
        return upgrade
    wake(upgrade.job, client)
    return upgrade


def change_strategy(job: Job, upgrade: JobUpgrade, now: float) -> None:
    """Record a checked strategy change as made: the Job row's strategy (what the controller
    reconciles the supervisor to, console.services.controller.reconcile_strategy) and the
    upgrade, confirmed, in one transaction; its output is audited across the change."""
    with transaction.atomic():
        outcome = f"strategy changed in place: {upgrade.reason}"
        if not JobUpgrade.objects.filter(pk=upgrade.pk, status=JobUpgrade.Status.REQUESTED).update(
            status=JobUpgrade.Status.CONFIRMED,
            switched_at=utc(now),
            ended_at=utc(now),
            outcome=outcome,
        ):
            return  # cancelled meanwhile: the job keeps its strategy
        upgrade.status = JobUpgrade.Status.CONFIRMED
        upgrade.switched_at = upgrade.ended_at = utc(now)
        upgrade.outcome = outcome
        job.strategy = upgrade.to_strategy
        job.save(update_fields=["strategy"])
        decide(
            job,
            ControlDecision.Kind.UPGRADE,
            f"upgrade {upgrade.pk}: strategy {upgrade.from_strategy} -> {upgrade.to_strategy}, "
            "in place",
        )
    dispatch(lambda: tasks.send(tasks.AUDIT_UPGRADE, upgrade.pk))


def stage_to_upgrade(
    supervisor: Supervisor | None, changed: set[str] | None = None
) -> tuple[str | None, str | None]:
    """(stage, its running primary's replica id) of the stage an upgrade replaces: the stage of
    the operators whose parameters change (`changed`), else the last stage (a user job has one,
    holding all its processing operators). UpgradeRequestError when `changed` spans stages."""
    if supervisor is None or not supervisor.stages:
        return None, None
    stages = [s for s, ops in supervisor.stage_operators.items() if set(ops) & (changed or set())]
    if len(stages) > 1:
        raise UpgradeRequestError(
            f"params: the operators changed run in stages {', '.join(stages)}; an upgrade "
            "changes one stage"
        )
    stage = stages[0] if stages else supervisor.stages[-1]
    primaries = [r.id for r in supervisor.of_stage(stage, PRIMARY) if r.state == RUNNING]
    return stage, (primaries[0] if primaries else None)


def dry_run(upgrade: JobUpgrade, supervisor: Supervisor, stage: str, blue: str) -> dict:
    """spark_runtime/upgrade_check.py in a child process: {"verdict", "batch", "detail"}."""
    source = os.path.join(checkpoint_root(), upgrade.job.key, stage, blue)
    command = [
        sys.executable, "-m", "spark_runtime.upgrade_check",
        "--job", upgrade.job.key, "--topology", upgrade.to_topology, "--stage", stage,
        "--operators", ",".join(supervisor.stage_operators[stage]),
        "--from-checkpoint", source, "--redis-url", settings.REDIS_URL,
        "--timeout", str(CHECK_TIMEOUT_S - 30),
    ]  # fmt: skip
    for param in as_cli_params(upgrade.to_params):
        command += ["--param", param]
    try:
        # A session of its own: it starts at the normal CPU priority (spark_runtime.cpu_priority:
        # autogroups), not at the controller's, above the primaries it would slow down.
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return {"verdict": upgrade_check.UNTESTED, "batch": None, "detail": "the check timed out"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"verdict": upgrade_check.SPARK_REFUSES, "batch": None, "detail": tail}
    verdict = json.loads(lines[-1])
    if not isinstance(verdict, dict) or not {"verdict", "detail"} <= verdict.keys():
        raise ValueError(f"the check's output is no verdict: {lines[-1][:200]}")
    return verdict


def decide_case(job: Job, upgrade: JobUpgrade, stage: str, verdict: dict, client):
    """(case, reason in plain words) from the dry run's verdict."""
    operator = stateful_operator(upgrade.to_topology) or stage
    kind, detail = verdict["verdict"], verdict["detail"]
    # Another parallelism: the copy's state was repartitioned, as green's will be.
    repartitioned = (
        f", its state {verdict['repartitioned']} first (another parallelism)"
        if verdict.get("repartitioned")
        else ""
    )
    if kind == upgrade_check.COMPATIBLE:
        batch = verdict.get("batch")
        return JobUpgrade.Case.SEEDED, (
            f"the new version ran a batch on a copy of the running version's state (committed "
            f"batch {batch}): it starts from that checkpoint{repartitioned}"
        )
    if kind == upgrade_check.UNTESTED:
        return JobUpgrade.Case.SEEDED, (
            f"{detail}; it starts from the running version's checkpoint{repartitioned}, and "
            "Spark checks the state at its first batch (a failure there rolls the upgrade back)"
        )
    if kind == upgrade_check.SPARK_REFUSES:
        return JobUpgrade.Case.REFUSED, f"Spark refuses the new version: {detail}"
    covered, why = input_retained_since_start(job, client)
    if not covered:
        return JobUpgrade.Case.REFUSED, (
            f"operator {operator}: its state is incompatible ({detail}) and cannot be rebuilt: "
            f"{why}"
        )
    return JobUpgrade.Case.REBUILD, (
        f"operator {operator}: its state is incompatible ({detail}); the new version rebuilds "
        f"it from the job's input stream, which {why}"
    )


def stateful_operator(topology: str) -> str | None:
    """The name of the topology's stateful operator (a user job has at most one)."""
    _, spec = job_topology(topology)
    return next((op.name for op in spec.operators if op.stateful), None)


def input_retained_since_start(job: Job, client) -> tuple[bool, str]:
    """Whether the job's input stream still holds every entry ever added to it (its state can
    depend on any of them), with what was found, in words. Redis (7.0 and later) counts the
    entries ever added and remembers the highest id ever deleted; Backstop never trims an input
    stream, so only a user's XTRIM or XDEL can have removed any."""
    import redis

    try:
        info = client.xinfo_stream(data_keys.input_stream(job.key))
    except redis.ResponseError:
        return False, "the job's input stream is gone"
    added, length = info.get("entries-added"), info.get("length")
    deleted = info.get("max-deleted-entry-id")
    if added is None:
        return False, "this Redis does not say whether entries were deleted (Redis 7 does)"
    deleted = deleted.decode() if isinstance(deleted, bytes) else deleted
    if added != length or deleted not in (None, "0-0"):
        return False, (
            f"the input stream holds {length} of the {added} entries ever added to it (up to "
            f"{deleted} deleted): the input before is gone"
        )
    return True, f"holds all {added} entries ever added to it"


def refuse(upgrade: JobUpgrade, stage: str, reason: str) -> JobUpgrade:
    """End a requested upgrade as refused, with the reason; one cancelled meanwhile stays so."""
    refused = JobUpgrade.objects.filter(pk=upgrade.pk, status=JobUpgrade.Status.REQUESTED).update(
        stage=stage,
        case=JobUpgrade.Case.REFUSED,
        reason=reason,
        status=JobUpgrade.Status.REFUSED,
        ended_at=timezone.now(),
        outcome=reason,
    )
    upgrade.refresh_from_db()
    if refused:
        decide(upgrade.job, ControlDecision.Kind.UPGRADE, f"upgrade {upgrade.pk} refused: {reason}")
    return upgrade


# --- the controller's part ---------------------------------------------------------------------


def reconcile_upgrade(job: Job, supervisor: Supervisor, now: float, client=None) -> list:
    """Bring the job's upgrade record and its supervisor's upgrade together, and act on what an
    operator asked: the supervisor actions to carry out. The record is written before the
    supervisor's state is saved (console.services.fleet), so after a controller died between
    the two each may be ahead of the other; the record's end wins, and a record whose upgrade
    the saved state never started is abandoned (its green, if started, is stopped).

    With `client` (the data plane's Redis) green is also watched while validating: its output
    latency and dead letters against blue's before the upgrade (upgrade.validation_failure)
    roll it back."""

    machine = supervisor.upgrade
    upgrade = job.upgrades.filter(status__in=JobUpgrade.UNDER_WAY).first()
    if upgrade is None and machine is not None and machine.under_way:
        upgrade = JobUpgrade.objects.filter(pk=machine.upgrade_id).first()
        if upgrade is not None and not upgrade.under_way:
            return replay_end(upgrade, supervisor, now)
        return []
    if upgrade is None:
        return []
    ours = machine is not None and machine.upgrade_id == upgrade.pk
    actions: list = []
    try:
        if not ours and upgrade.status != JobUpgrade.Status.REQUESTED:
            abandon(upgrade, "the controller restarted before the upgrade's state was saved")
            if upgrade.green_replica and upgrade.green_replica not in supervisor.replicas:
                return [KillReplica(upgrade.green_replica)]
            return []
        if not ours and not upgrade.case and client is not None:
            resend_lost_check(upgrade, client)
        if not ours and not upgrade.case and check_overdue(upgrade, now):
            # The check's task was lost or failed: no verdict can come any more.
            why = (
                f"the state check did not report within {CHECK_DEADLINE_S:.0f} s (its task was "
                "lost or failed); ask for the upgrade again"
            )
            refuse(upgrade, "", why)
            return []
        if not ours and upgrade.case == JobUpgrade.Case.IN_PLACE:
            change_strategy(job, upgrade, now)
            return []  # the job's reconcile brings the supervisor to the new strategy
        if not ours:
            if upgrade.case:
                normal = blue_normal(job, upgrade.stage, client, now) if client else None
                actions = begin(upgrade, supervisor, now, normal)
        elif upgrade.requested_action == ROLLBACK and machine.under_way:
            actions = upgrades.roll_back(supervisor, now, ended_by_whom(upgrade, "rolled back"))
        elif upgrade.requested_action == CONFIRM and machine.phase == upgrades.VALIDATING:
            actions = upgrades.confirm(supervisor, now, ended_by_whom(upgrade, "confirmed"))
        elif machine.mode == upgrades.APP_RESTART:
            actions = upgrades.app_tick(supervisor, now)
        elif machine.phase == upgrades.VALIDATING:
            policy = Policy.current()  # one read per reconcile: this runs every 0.25 s
            validation_s = policy.upgrade_validation_s
            failure = (
                upgrades.validation_failure(
                    machine, green_seen(job, machine, client, now, policy.recovery_band), now
                )
                if client is not None
                else None
            )
            if failure is not None:
                actions = upgrades.roll_back(supervisor, now, failure)
            elif (
                now - machine.switched_at >= validation_s
                and machine.green_ran_since_switch
                and machine.results_checked
            ):
                why = f"the new version wrote for {validation_s:g} s without a failure"
                if machine.compare_results and not machine.results_comparable:
                    why += ", its results not compared (the stage writes none with keys)"
                elif machine.compare_results:
                    why += (
                        f", its results equal to the old version's on the "
                        f"{machine.results_compared} keys both computed"
                    )
                actions = upgrades.confirm(supervisor, now, why)
    except upgrades.UpgradeRefused as exc:
        if not ours:  # it could not start (the primary is restarting, say): nothing started
            abandon(upgrade, f"could not start: {exc}")
            return []
        # Not carried out: whoever asked did not end it. Cleared only if it is still what was
        # asked: another request meanwhile is the next reconcile's.
        JobUpgrade.objects.filter(pk=upgrade.pk, requested_action=upgrade.requested_action).update(
            requested_action="", ended_by=None
        )
        decide(job, ControlDecision.Kind.UPGRADE, f"upgrade {upgrade.pk}: {exc}")
        return []
    record_phase(job, upgrade, supervisor)
    return actions


# A check's runner not heard of for this long is gone (controllers say they are alive every
# second); a paused one that comes back runs a twin check, whose verdict loses (record_case).
CHECK_RUNNER_ALIVE_S = 10.0


def resend_lost_check(upgrade: JobUpgrade, client) -> bool:
    """Send the state check of a requested upgrade again when the controller process running
    it is gone (killed mid-check: its task, acknowledged late, would come back only after the
    broker's visibility timeout, an hour). Returns whether it did."""
    runner_key = control_keys.upgrade_check_runner(upgrade.job.key, upgrade.pk)
    runner = client.get(runner_key)
    if not runner or runner in leases.live_controllers(client, CHECK_RUNNER_ALIVE_S):
        return False
    if not client.delete(runner_key):
        return False  # another reconcile sent it meanwhile
    tasks.send(tasks.CHECK_UPGRADE, upgrade.pk)
    why = f"upgrade {upgrade.pk}: its state check ran on {runner}, which is gone: checking again"
    decide(upgrade.job, ControlDecision.Kind.UPGRADE, why)
    return True


def check_overdue(upgrade: JobUpgrade, now: float) -> bool:
    """Whether the state check of a requested upgrade can no longer report (CHECK_DEADLINE_S)."""
    return now - upgrade.requested_at.timestamp() > CHECK_DEADLINE_S


def replay_end(upgrade: JobUpgrade, supervisor: Supervisor, now: float) -> list:
    """The record ended but the saved supervisor state did not: end it there the same way."""
    try:
        if upgrade.status == JobUpgrade.Status.CONFIRMED:
            return upgrades.confirm(supervisor, now, upgrade.outcome)
        return upgrades.roll_back(supervisor, now, upgrade.outcome)
    except upgrades.UpgradeRefused:
        upgrades.abandon(supervisor, now, upgrade.outcome)
        return []


def abandon(upgrade: JobUpgrade, why: str) -> None:
    """End a record whose upgrade cannot go on, saying why; one that ended meanwhile (cancelled,
    confirmed, rolled back) keeps its end."""
    abandoned = JobUpgrade.objects.filter(pk=upgrade.pk, status__in=JobUpgrade.UNDER_WAY).update(
        status=JobUpgrade.Status.ABANDONED,
        ended_at=timezone.now(),
        outcome=why,
        requested_action="",
    )
    upgrade.refresh_from_db()
    if abandoned:
        decide(upgrade.job, ControlDecision.Kind.UPGRADE, f"upgrade {upgrade.pk} abandoned: {why}")


def end_open_upgrades(job: Job, why: str) -> None:
    """The job stopped or failed: its upgrade under way, if any, ends there."""
    for upgrade in job.upgrades.filter(status__in=JobUpgrade.UNDER_WAY):
        abandon(upgrade, why)


def blue_normal(job: Job, stage: str, client, now: float) -> upgrades.BlueNormal:
    """Blue's output before the upgrade: the p90 latency band learned on the policy's reference
    window, as a fault's recovery is judged, and the stage's dead letter counter."""
    settings = recovery_settings(Policy.current().to_config())
    start = now - settings.reference_window_s
    records = read_progress(client, job.key, start - 5, count=PROGRESS_READ_LIMIT)
    return upgrades.BlueNormal(
        latency_limit_ms=latency_limit_ms(records, start, now, settings),
        dead_letters=dead_letters(client, job, stage),
    )


def green_seen(
    job: Job, machine: upgrades.BlueGreen, client, now: float, band: float
) -> upgrades.GreenSeen:
    """Green's output now: its p90 latency in each whole second of the latency window, and the
    stage's dead letter counter; `band`: the policy's recovery band."""
    end = float(int(now))  # whole seconds: the current one is not over
    start = end - upgrades.LATENCY_WINDOW_S
    records = read_progress(client, job.key, start - 5, count=PROGRESS_READ_LIMIT)
    return upgrades.GreenSeen(
        p90_ms=tuple(p90_per_second_ms(records, start, end)),
        dead_letters=dead_letters(client, job, machine.stage),
        band=band,
    )


def dead_letters(client, job: Job, stage: str) -> int:
    """Malformed input entries the stage has dead-lettered since the job started."""
    return int(client.hget(data_keys.stats(job.key), f"dead:{stage}") or 0)


def begin(
    upgrade: JobUpgrade,
    supervisor: Supervisor,
    now: float,
    normal: upgrades.BlueNormal | None = None,
) -> list:
    """Start a checked upgrade: its record is claimed first (requested -> starting, a
    compare-and-set), so an operator's cancel meanwhile wins and nothing starts; then the
    supervisor's upgrade begins, and the record names blue and green before green is asked
    for (a controller that dies after it leaves a record whose green its successor stops)."""
    claimed = JobUpgrade.objects.filter(pk=upgrade.pk, status=JobUpgrade.Status.REQUESTED).update(
        status=JobUpgrade.Status.STARTING
    )
    if not claimed:
        upgrade.refresh_from_db()
        return []
    upgrade.status = JobUpgrade.Status.STARTING
    if upgrade.case == JobUpgrade.Case.APP_RESTART:
        actions = upgrades.begin_app_restart(
            supervisor, upgrade.pk, upgrade.stage, upgrade.to_topology, now
        )
        upgrade.blue_replica = upgrade.green_replica = supervisor.upgrade.blue
        name_replicas(upgrade)
        decide(
            upgrade.job,
            ControlDecision.Kind.UPGRADE,
            f"upgrade {upgrade.pk}: {upgrade.blue_replica} stops the app's queries; "
            f"{upgrade.to_topology} starts from its checkpoints",
            stage=upgrade.stage,
            replica_id=upgrade.blue_replica,
        )
        return actions
    if upgrade.mode == JobUpgrade.Mode.STOP_RESTART:
        actions = upgrades.restart_in_place(
            supervisor, upgrade.pk, upgrade.stage, upgrade.to_topology,
            as_cli_params(upgrade.to_params), now,
        )  # fmt: skip
        upgrade.blue_replica = upgrade.green_replica = supervisor.upgrade.blue
        name_replicas(upgrade)
        decide(
            upgrade.job,
            ControlDecision.Kind.UPGRADE,
            f"upgrade {upgrade.pk}: restart {upgrade.stage} from its checkpoint as "
            f"{upgrade.to_topology}",
            stage=upgrade.stage,
        )
        return actions
    seeded = upgrade.case == JobUpgrade.Case.SEEDED
    actions = upgrades.begin(
        supervisor, upgrade.pk, upgrade.stage, upgrade.to_topology,
        as_cli_params(upgrade.to_params), seeded, now, normal or upgrades.BlueNormal(),
        compare_results=upgrade.result_preserving,
    )  # fmt: skip
    upgrade.blue_replica = supervisor.upgrade.blue
    upgrade.green_replica = supervisor.upgrade.green
    name_replicas(upgrade)
    decide(
        upgrade.job,
        ControlDecision.Kind.UPGRADE,
        f"upgrade {upgrade.pk}: {upgrade.to_topology} starts as {upgrade.green_replica} beside "
        f"{upgrade.blue_replica} ({upgrade.case})",
        stage=upgrade.stage,
        replica_id=upgrade.green_replica,
    )
    announce_phase(upgrade.job, upgrade, supervisor)
    return actions


def name_replicas(upgrade: JobUpgrade) -> None:
    """Write blue and green to the record (fields only the controller writes)."""
    JobUpgrade.objects.filter(pk=upgrade.pk).update(
        blue_replica=upgrade.blue_replica, green_replica=upgrade.green_replica
    )


def ended_by_whom(upgrade: JobUpgrade, what: str) -> str:
    who = upgrade.ended_by.get_username() if upgrade.ended_by else "an operator"
    return f"{what} by {who}"


def record_phase(job: Job, upgrade: JobUpgrade, supervisor: Supervisor) -> None:
    """Copy the supervisor's phase of the upgrade to its record (and the version in force to
    the Job row)."""
    machine = supervisor.upgrade
    if machine is None or machine.upgrade_id != upgrade.pk:
        return
    if (
        machine.compare_results
        and machine.switched
        and (
            (upgrade.results_compared, upgrade.results_differing)
            != (machine.results_compared, machine.results_differing)
        )
    ):
        upgrade.results_compared = machine.results_compared
        upgrade.results_differing = machine.results_differing
        JobUpgrade.objects.filter(pk=upgrade.pk).update(
            results_compared=upgrade.results_compared,
            results_differing=upgrade.results_differing,
        )
    status = STATUS_OF_PHASE[machine.phase]
    if status == upgrade.status and not (machine.ended_at and not upgrade.ended_at):
        return
    # Only the fields the controller owns, from the status this reconcile read: an operator's
    # confirm or rollback written meanwhile stays for the next reconcile to carry out.
    changes: dict = {"status": status}
    if machine.switched_at and not upgrade.switched_at:
        changes["switched_at"] = utc(machine.switched_at)
    if machine.ended_at:
        # Ended: what was asked is done or moot.
        changes.update(ended_at=utc(machine.ended_at), outcome=machine.outcome, requested_action="")
    moved = JobUpgrade.objects.filter(pk=upgrade.pk, status=upgrade.status).update(**changes)
    if not moved:
        # The record ended meanwhile (the job stopped): the next reconcile ends the supervisor's
        # upgrade the same way (replay_end).
        upgrade.refresh_from_db()
        return
    for name, value in changes.items():
        setattr(upgrade, name, value)
    announce_phase(job, upgrade, supervisor)


def announce_phase(job: Job, upgrade: JobUpgrade, supervisor: Supervisor) -> None:
    """Once the record took the supervisor's phase: the version in force to the Job row, the
    replica rows' roles, a decision, and the audit of an upgrade that ended across a switch."""
    machine = supervisor.upgrade
    status = STATUS_OF_PHASE[machine.phase]
    job.topology = supervisor.topology
    job.save(update_fields=["topology"])
    sync_roles(job, supervisor, machine)
    decide(
        job,
        ControlDecision.Kind.UPGRADE,
        f"upgrade {upgrade.pk}: {status.label}"
        + (f" ({machine.outcome})" if machine.outcome else ""),
        stage=upgrade.stage,
    )
    if upgrade.switched_at and machine.phase in (upgrades.CONFIRMED, upgrades.ROLLED_BACK):
        # Ended across a switch: its output is audited (console/services/upgrade_audit.py).
        dispatch(lambda: tasks.send(tasks.AUDIT_UPGRADE, upgrade.pk))


def sync_roles(job: Job, supervisor: Supervisor, machine) -> None:
    """The replica rows of blue and green say their roles now, not at the next policy cycle:
    a fault aimed at the stage's primary (the console, the API) reads the rows."""
    for replica_id in (machine.blue, machine.green):
        replica = supervisor.replicas.get(replica_id)
        if replica is not None and replica.state != FAILED:
            Replica.objects.filter(replica_id=Replica.full_id(job.key, replica_id)).update(
                role=replica.role
            )
