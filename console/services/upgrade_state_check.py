"""The state check of a requested upgrade (a controller task, workers/controller.py): which
case it is, decided by a dry run before anything starts.

The dry run of the new version on a copy of the running primary's checkpoint
(spark_runtime/upgrade_check.py, in a child process: it needs a SparkSession) decides the case:
`seeded` (the state is compatible), `rebuild` (it is not, and the job's input stream still holds
everything since the job started, so the new version rebuilds its state from it), or `refused`
(the state is incompatible and the input before some time is gone, or Spark refuses the new
version whatever the state), with the reason in plain words. A strategy change is checked
against the stages the job runs as (`in_place`), an existing app needs no dry run
(`app_restart`). Nothing has started yet; a refused upgrade ends there. Else the job's
controller is woken (console/services/upgrade_control.py starts it).

The request is console/services/upgrades.py's; its writes here are compare-and-sets on the
record's status as described there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.conf import settings
from django.utils import timezone

from console.models import ControlDecision, Job, JobUpgrade
from console.services.control.act import checkpoint_root
from console.services.control.observe import load_supervisor
from console.services.control.record import decide
from console.services.topologies import job_topology
from console.services.upgrades import UpgradeRequestError, as_cli_params, is_app, wake
from infra import keys as control_keys
from infra import leases, tasks
from spark_runtime import keys as data_keys
from spark_runtime import upgrade as upgrades
from spark_runtime import upgrade_check
from spark_runtime.failure_text import failure_cause
from spark_runtime.replicas import PRIMARY, RUNNING
from spark_runtime.strategies import get_strategy, in_place_refusal
from spark_runtime.supervision import Supervisor

CHECK_TIMEOUT_S = 120.0  # the dry run's own wait for a batch, plus a SparkSession's start
# After this long without a verdict no check can write one: its task expires unstarted in the
# queue after CHECK_UPGRADE.expires_s, and a started one is killed at CHECK_TIMEOUT_S + 60
# (workers/controller.py); a minute's margin on top.
CHECK_DEADLINE_S = tasks.CHECK_UPGRADE.expires_s + CHECK_TIMEOUT_S + 120


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
        cause = failure_cause(done.stderr) if done.stderr.strip() else "no output"
        return {"verdict": upgrade_check.SPARK_REFUSES, "batch": None, "detail": cause}
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
