"""Upgrading a running job blue/green: the request side, what the API, the console and
`manage.py upgrade_job` call.

The switching itself is spark_runtime/upgrade.py's (events -> actions in the job's supervisor);
around it, on the console's side, an upgrade passes through three modules:

1. here, `request_upgrade`: checks what can be checked at once (the job runs, one upgrade at a
   time, the target is a version of the job's topology with the same operators, something
   changes) and records a JobUpgrade, `requested`; a controller task runs the state check.
   `request_end` asks for a confirm or a rollback by hand, `wake` has the job's controller
   look at it at once.
2. console/services/upgrade_state_check.py, the state check: a dry run of the new version on a copy
   of the running state decides the case (seeded, rebuild, refused, in place, app restart).
3. console/services/upgrade_control.py, the controller's part: what the job's reconcile does
   with an upgrade under way (start green, carry out a confirm or rollback, confirm by itself,
   copy the supervisor's phase to the record). Its output is audited afterwards by
   console/services/upgrade_audit.py.

Every write of a record is a compare-and-set on its status (`filter(pk=..., status=...)
.update(...)`) of the fields its writer owns, never a save of a whole copy read earlier: an
operator's confirm or rollback (`requested_action`, `ended_by`) cannot be overwritten by a
reconcile that read the record before it, and a cancel before the start cannot be overwritten
by the state check's refusal or the controller's start. The loser of a race leaves the record
alone; the controller's next reconcile sees what won (every reconcile looks at a job with an
upgrade under way, console.services.fleet).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from console.models import ControlDecision, Job, JobUpgrade
from console.redis import redis_client
from console.services import audit_log
from console.services.control.record import decide
from console.services.jobs import dispatch
from console.services.topologies import job_topology
from infra import keys as control_keys
from infra import tasks
from spark_runtime.apps import AppDefinition
from spark_runtime.strategies import STRATEGIES

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
