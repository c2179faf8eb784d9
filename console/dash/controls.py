"""The console's write actions, each checking the Django user's role on the server first.

Hiding buttons is only a convenience: the Dash update endpoint can be called by hand, so every
action here refuses users below the required role (RoleRefused, a 403) before touching anything.
All writes go through console.services, the same code the REST API uses.
"""

from __future__ import annotations

import functools

from django.core.exceptions import PermissionDenied

from console.models import FaultInjection, InvalidTransition, Job, JobUpgrade, Node, Policy
from console.policy.config import request_errors
from console.roles import ADMIN, OPERATOR
from console.services import jobs as job_service
from console.services.authz import RoleRequired, check_role
from console.services.faults import FaultRefused, request_fault
from console.services.policy import PolicyRejected, change_policy
from console.services.shared_data import invalidate_all
from console.services.teams import TeamRequestError, jobs_visible_to, team_for_new_job
from console.services.upgrades import (
    CONFIRM,
    ROLLBACK,
    UpgradeRequestError,
    request_end,
    request_upgrade,
)


class ActionRefused(Exception):
    """The action was not carried out; the message says why, for the person who asked."""


class RoleRefused(PermissionDenied):
    """The user's role does not allow the action. Not shown as a message: it leaves the callback,
    and Django answers the Dash update request with 403 (only a forged request gets here; the
    controls are not rendered for users below the role)."""


def _writes(action):
    """An action that changes what pages show: the shared page data starts again after it, so
    the next refresh shows the change (console.services.shared_data)."""

    @functools.wraps(action)
    def act(*args, **kwargs):
        result = action(*args, **kwargs)
        invalidate_all()
        return result

    return act


def _require(user, role: str) -> None:
    try:
        check_role(user, role)
    except RoleRequired as exc:
        raise RoleRefused(str(exc)) from exc


@_writes
def start_job(
    user,
    *,
    name: str,
    topology: str,
    strategy: str,
    rate,
    source_topic: str | None = None,
    sink_topic: str | None = None,
    team: str | None = None,
) -> Job:
    """Create a job (the controller starts it), as POST /api/jobs/ does; `source_topic` and
    `sink_topic`: Kafka topics to read and to write the results to (empty: none); `team`: the
    team's name (empty: the user's only team)."""
    _require(user, OPERATOR)
    if not (name or "").strip():
        raise ActionRefused("name: give the job a name")
    source_topic, sink_topic = (source_topic or "").strip(), (sink_topic or "").strip()
    try:
        owner = team_for_new_job(user, team)
    except TeamRequestError as exc:
        raise ActionRefused(str(exc)) from exc
    try:
        return job_service.create_job(
            team=owner,
            name=name.strip(),
            topology=topology,
            strategy=strategy,
            params={"rate": rate} if rate is not None else {},
            user=user,
            source={"kind": "kafka", "topic": source_topic} if source_topic else None,
            sink={"kind": "kafka", "topic": sink_topic} if sink_topic else None,
        )
    except job_service.JobRequestError as exc:
        raise ActionRefused(str(exc)) from exc


@_writes
def stop_job(user, job_id) -> Job:
    """Ask a job to stop, as POST /api/jobs/{id}/stop/ does."""
    _require(user, OPERATOR)
    if job_id in (None, ""):
        raise ActionRefused("choose a job to stop")
    job = _job(user, job_id)
    return job_service.stop_job(job, f"stopped by {user.username} from the console", user=user)


@_writes
def restart_job(user, job_id) -> Job:
    """Ask for a failed or stopped job to run again, as POST /api/jobs/{id}/restart/ does."""
    _require(user, OPERATOR)
    job = _job(user, job_id)
    try:
        return job_service.restart_job(job, user=user)
    except InvalidTransition as exc:
        raise ActionRefused(str(exc)) from exc


@_writes
def inject_fault(
    user, job_id, *, kind: str, operator: str | None, node_id, duration_s, workers=None
) -> FaultInjection:
    """Record a fault request for the controller, as POST /api/jobs/{id}/faults/ does.

    Empty inputs take the kind's defaults; anything given goes to the fault service, which
    refuses wrong types and out-of-bound values with the same message as the API.
    """
    _require(user, OPERATOR)
    job = _job(user, job_id)
    if not isinstance(kind, str) or not isinstance(operator, str | None):
        raise ActionRefused("kind, target_operator: choose them from the lists")
    if node_id not in (None, "") and not _is_id(node_id):
        raise ActionRefused(f"target_node: not a node id: {node_id!r:.40}")
    node = Node.objects.filter(pk=node_id).first() if node_id else None
    params = {}
    if duration_s not in (None, ""):
        params["duration_s"] = duration_s
    if workers not in (None, ""):
        params["workers"] = workers
    try:
        return request_fault(
            job,
            kind,
            target_operator=operator or "",
            target_node=node,
            params=params,
            requested_by=user,
        )
    except FaultRefused as exc:
        raise ActionRefused(str(exc)) from exc


# A params box holds a few lines; anything much longer is not typed by a person.
MAX_PARAMS_TEXT = 4000


def parse_params(text) -> dict[str, str]:
    """The upgrade's operator parameters from `OPERATOR.KEY=value` lines (blank lines are
    skipped): {"OPERATOR.KEY": "value"}. ActionRefused naming the field and the line otherwise;
    whether each parameter exists is the upgrade service's check."""
    if text is None:
        return {}
    if not isinstance(text, str) or len(text) > MAX_PARAMS_TEXT:
        raise ActionRefused("params: one OPERATOR.KEY=value a line")
    params: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        name, equals, value = (part.strip() for part in line.partition("="))
        operator, dot, key = name.partition(".")
        if not (equals and dot and operator and key and value):
            raise ActionRefused(
                f"params: line {number} ({line.strip()!r:.60}): expected OPERATOR.KEY=value"
            )
        if name in params:
            raise ActionRefused(f"params: line {number}: {name} is given twice")
        params[name] = value
    return params


@_writes
def upgrade_job(user, job_id, topology, params_text, result_preserving=False) -> JobUpgrade:
    """Ask for an upgrade of a running job to `topology` (a version of its topology; empty:
    the one it runs) with the operator parameters of `params_text`, declared
    `result_preserving` or not, as POST /api/jobs/{id}/upgrade/ does. The service's refusal
    names the field at fault."""
    _require(user, OPERATOR)
    job = _job(user, job_id)
    if not isinstance(topology, str | None):
        raise ActionRefused("topology: choose a version from the list")
    params = parse_params(params_text)
    try:
        return request_upgrade(
            job,
            topology=topology or None,
            params=params,
            user=user,
            result_preserving=result_preserving,
        )
    except UpgradeRequestError as exc:
        raise ActionRefused(str(exc)) from exc


@_writes
def change_strategy(user, job_id, strategy) -> JobUpgrade:
    """Ask for a change of a running job's strategy, as POST /api/jobs/{id}/upgrade/ with
    {"strategy": ...} does; the service refuses a strategy that cuts the job otherwise."""
    _require(user, OPERATOR)
    job = _job(user, job_id)
    if not isinstance(strategy, str) or not strategy:
        raise ActionRefused("strategy: choose a strategy from the list")
    try:
        return request_upgrade(job, strategy=strategy, user=user)
    except UpgradeRequestError as exc:
        raise ActionRefused(str(exc)) from exc


@_writes
def confirm_upgrade(user, upgrade_id) -> JobUpgrade:
    """Ask the job's controller to confirm an upgrade now (the old version retires), as POST
    /api/jobs/{id}/upgrades/{uid}/confirm/ does."""
    return _end_upgrade(user, upgrade_id, CONFIRM)


@_writes
def roll_back_upgrade(user, upgrade_id) -> JobUpgrade:
    """Ask the job's controller to roll an upgrade back now (the old version writes again), as
    POST /api/jobs/{id}/upgrades/{uid}/rollback/ does."""
    return _end_upgrade(user, upgrade_id, ROLLBACK)


def _end_upgrade(user, upgrade_id, action: str) -> JobUpgrade:
    _require(user, OPERATOR)
    upgrades = JobUpgrade.objects.filter(job__in=jobs_visible_to(user).values("pk"))
    upgrade = upgrades.filter(pk=upgrade_id).first() if _is_id(upgrade_id) else None
    if upgrade is None:
        raise ActionRefused("no such upgrade")
    try:
        return request_end(upgrade, action, user)
    except UpgradeRequestError as exc:
        raise ActionRefused(str(exc)) from exc


def _job(user, job_id) -> Job:
    """The job `job_id` names among the ones `user` sees (a forged or stale id, or a job of
    another team: ActionRefused, the same "no such job" for each)."""
    job = jobs_visible_to(user).filter(pk=job_id).first() if _is_id(job_id) else None
    if job is None:
        raise ActionRefused("no such job")
    return job


def _is_id(value) -> bool:
    """A primary key as a Dash component sends it: an int (not a bool) or a string of digits."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())


@_writes
def change_threshold(user, *, field: str, value, reason: str):
    """Write a new policy version with one threshold changed, as PATCH /api/policy/ does."""
    _require(user, ADMIN)
    if not field or value is None:
        raise ActionRefused("choose a threshold and give it a value")
    # The endpoint can be called by hand: check the field and the raw value as the API does.
    if not isinstance(field, str) or field not in Policy.threshold_field_names():
        raise ActionRefused(f"{field!s:.60}: unknown policy field")
    if not isinstance(reason, str | None):
        raise ActionRefused("reason: must be text")
    errors = request_errors({field: value}, full=False)
    if errors:
        raise ActionRefused("; ".join(errors.values()))
    # Number inputs send 5.0 for 5; integer thresholds (q_samples, slow_task_limit) need an int.
    current = getattr(Policy.current(), field, None)
    if isinstance(current, int) and isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        # The policy service requires a reason; an empty one is refused there, with its message.
        return change_policy({field: value}, user=user, reason=reason or "")
    except PolicyRejected as exc:
        raise ActionRefused(str(exc)) from exc
