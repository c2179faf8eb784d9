"""The controller's part of an upgrade: what the job's reconcile (console.services.controller)
does with an upgrade under way.

`reconcile_upgrade` starts green once the state check (console/services/upgrade_state_check.py) has
decided the case, carries out a confirm or rollback asked by hand (console/services/upgrades.py),
confirms by itself once green has written for the policy's `upgrade_validation_s`, rolls back
when green fails its validation, drives an app's stop and start, makes a strategy change in
place, and copies the supervisor's phase to the record (and the job's version to the Job row at
the switch and back at a rollback). The blue/green state machine itself is
spark_runtime/upgrade.py's; this module feeds it and records what it did. The record's writes
here are compare-and-sets on its status, as console/services/upgrades.py describes.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from console.clock import utc
from console.models import ControlDecision, Job, JobUpgrade, Policy, Replica
from console.policy.recovery import latency_limit_ms, p90_per_second_ms
from console.services.control.record import decide
from console.services.jobs import dispatch
from console.services.recovery import PROGRESS_READ_LIMIT, recovery_settings
from console.services.upgrade_state_check import (
    CHECK_DEADLINE_S,
    check_overdue,
    refuse,
    resend_lost_check,
)
from console.services.upgrades import CONFIRM, ROLLBACK, as_cli_params
from infra import tasks
from spark_runtime import keys as data_keys
from spark_runtime import upgrade as upgrades
from spark_runtime.progress import read_progress
from spark_runtime.replicas import FAILED, KillReplica
from spark_runtime.supervision import Supervisor

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
