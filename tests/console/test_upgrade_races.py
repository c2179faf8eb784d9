"""Upgrades against the races and deaths around them (issue 58): an operator's request made
while the controller's reconcile holds an older copy of the record, a controller that dies
between writing the record and saving the supervision state, a wake-up that was consumed, and a
state check that cannot run. Real database and Redis; each interleaving is played by calling the
steps in order (what the reconcile reads, what the operator asks, what the reconcile writes)."""

from __future__ import annotations

import json
import time

import pytest

from console.models import ControlDecision, Job, JobUpgrade, Policy, Replica
from console.redis import redis_client
from console.roles import OPERATOR
from console.services import controller, fleet, upgrade_control, upgrade_state_check, upgrades
from console.services.control.observe import load_supervisor, save_supervisor
from infra import keys, leases, tasks
from spark_runtime import keys as data_keys
from spark_runtime.replicas import HeartbeatSeen, KillReplica, PromoteStandby
from spark_runtime.supervision import Supervisor
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db

TOPN = {"topn": ("window_count", "topn")}
RUNNING_AS = {"state": "running", "lag_s": 0.5, "batches": 1}


@pytest.fixture
def client():
    conn = redis_client()
    conn.flushdb()  # leases, cursors and states of earlier tests' jobs of the same key
    yield conn
    conn.flushdb()


def running_job() -> Job:
    for name in ("node-1", "node-2"):
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    Policy.objects.create(upgrade_validation_s=3600, reason="test")
    return make_job(Job.Status.RUNNING, topology="topn", name="tn", strategy="local-restart")


def running_supervisor(job: Job, client, now: float) -> Supervisor:
    """topn-1 runs as the primary, its heartbeat fresh in Redis; the state is saved."""
    sup = Supervisor(job.key, "topn", TOPN, job.strategy, ["node-1", "node-2"])
    sup.start(now)
    beat = {"role": "primary", **RUNNING_AS}
    sup.handle(HeartbeatSeen("topn-1", now, beat))
    client.set(data_keys.heartbeat(job.key, "topn-1"), json.dumps(beat), ex=60)
    save_supervisor(client, job, sup)
    return sup


def switch(sup: Supervisor, green: str, blue: str, at: float) -> None:
    """Heartbeats that carry the supervisor's upgrade through the switch to validating."""
    for replica, role in ((green, "standby"), (blue, "standby"), (green, "primary")):
        sup.handle(HeartbeatSeen(replica, at, {"role": role, **RUNNING_AS}))


def reconcile_slot(job: Job, supervisor: Supervisor | None) -> fleet.JobSlot:
    """The slot a controller makes when it takes the job (fleet.FleetController._take), its
    policy cycle not due (it is not what these tests are about)."""
    return fleet.JobSlot(job=job, supervisor=supervisor, next_cycle=time.monotonic() + 3600)


# --- defect 3: an operator's request is never overwritten by the controller -----------------


def test_a_rollback_asked_while_a_reconcile_holds_its_copy_survives_the_reconciles_write(
    client, users, api_as
):
    job = running_job()
    now = time.time()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    sup = running_supervisor(job, client, now)
    upgrade_control.reconcile_upgrade(
        job, sup, now
    )  # green topn-2 starts: the record says starting
    switch(sup, "topn-2", "topn-1", now + 1)
    assert sup.upgrade.phase == "validating"
    # The reconcile reads its copy of the record (still `starting`)...
    copy = job.upgrades.filter(status__in=JobUpgrade.UNDER_WAY).first()
    # ... the operator asks for a rollback, and is told it is accepted...
    response = api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/rollback/")
    assert response.status_code == 202
    # ... and the reconcile writes the phase it saw.
    upgrade_control.record_phase(job, copy, sup)
    upgrade.refresh_from_db()
    assert upgrade.status == "validating"
    assert (upgrade.requested_action, upgrade.ended_by_id) == ("rollback", users[OPERATOR].pk)
    # The next reconcile carries the rollback out.
    actions = upgrade_control.reconcile_upgrade(job, sup, now + 2)
    assert actions == [KillReplica("topn-2"), PromoteStandby("topn-1", "topn")]
    upgrade.refresh_from_db()
    assert (upgrade.status, upgrade.outcome) == ("rolled_back", "rolled back by otto")


def test_a_cancel_during_the_state_check_is_not_overwritten_by_its_verdict(client, users, api_as):
    job = running_job()
    refused = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    # The state check reads the record (requested) and runs its dry run; meanwhile the operator
    # cancels it (rollback before anything started); then the check refuses it.
    copy = JobUpgrade.objects.get(pk=refused.pk)
    api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{refused.pk}/rollback/")
    upgrade_state_check.refuse(copy, "topn", "Spark refuses the new version: AnalysisException")
    refused.refresh_from_db()
    assert (refused.status, refused.outcome) == ("abandoned", "cancelled before it started by otto")
    assert refused.ended_by.username == "otto" and refused.case == ""
    # The same with a check that finds the upgrade possible: the case is not written either.
    checked = upgrades.request_upgrade(job, params={"topn.n": 4}, user=users[OPERATOR])
    copy = JobUpgrade.objects.get(pk=checked.pk)
    api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{checked.pk}/rollback/")
    copy.stage, copy.case, copy.reason = "topn", JobUpgrade.Case.SEEDED, "compatible"
    assert not upgrade_state_check.record_case(copy)
    checked.refresh_from_db()
    assert (checked.status, checked.case) == ("abandoned", "")
    assert not job.decisions.filter(reason__contains="refused").exists()


def test_a_cancel_between_the_reconciles_read_and_its_start_wins(client, users, api_as):
    job = running_job()
    now = time.time()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    sup = running_supervisor(job, client, now)
    copy = job.upgrades.filter(status__in=JobUpgrade.UNDER_WAY).first()  # the reconcile's read
    api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/rollback/")
    # What the reconcile does next with its copy: start green, write the phase.
    actions = upgrade_control.begin(copy, sup, now)
    upgrade_control.record_phase(job, copy, sup)
    assert actions == [] and sup.upgrade is None and set(sup.replicas) == {"topn-1"}
    upgrade.refresh_from_db()
    assert (upgrade.status, upgrade.outcome) == ("abandoned", "cancelled before it started by otto")
    assert upgrade.green_replica == ""


def test_an_abandon_keeps_an_end_written_meanwhile(client, users, api_as):
    job = running_job()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    copy = JobUpgrade.objects.get(pk=upgrade.pk)  # a reconcile whose start will be refused
    api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/rollback/")
    upgrade_control.abandon(copy, "could not start: stage topn has no running primary to upgrade")
    upgrade.refresh_from_db()
    assert upgrade.outcome == "cancelled before it started by otto"
    assert upgrade.ended_by.username == "otto"
    assert not job.decisions.filter(reason__contains="abandoned").exists()


# --- defect 4: no upgrade sticks ------------------------------------------------------------


def test_a_controller_that_takes_over_mid_upgrade_ends_it_and_stops_the_orphaned_green(
    client, users
):
    """Controller A consumes the wake-up and writes the record (starting, green named), then
    dies (or loses the lease) before it saves the supervision state and sends green's start.
    B takes the job over from the state last saved, which knows nothing of the upgrade, and no
    wake-up is left."""
    job = running_job()
    now = time.time()
    running_supervisor(job, client, now)
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    upgrades.wake(job, client)  # what the state check does once it decided the case
    view = fleet.read_fleet_view(client)
    # Controller A: the upgrade's step decided and recorded, not carried out (A dies first).
    a = load_supervisor(client, job)
    assert upgrade_control.reconcile_upgrade(job, a, now, client)
    upgrade.refresh_from_db()
    assert (upgrade.status, upgrade.green_replica) == ("starting", "topn-2")
    # Controller B takes over: the saved state, a fresh slot.
    b = load_supervisor(client, job)
    assert b.upgrade is None
    assert controller.reconcile_job(job, b, client, view, reconcile_slot(job, b))
    upgrade.refresh_from_db()
    assert upgrade.status == "abandoned"
    assert "restarted before the upgrade's state was saved" in upgrade.outcome
    # The job can be upgraded again (not 409 for ever).
    assert upgrades.request_upgrade(job, params={"topn.n": 4}, user=users[OPERATOR]).pk


def test_a_controller_that_takes_over_after_green_was_started_goes_on_with_the_upgrade(
    client, users
):
    """Controller A starts green, then dies before its end-of-reconcile save: the state that
    names green was saved before green's start was sent, so B goes on with the upgrade instead
    of abandoning it and orphaning green."""
    job = running_job()
    now = time.time()
    running_supervisor(job, client, now)
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    upgrades.wake(job, client)
    view = fleet.read_fleet_view(client)
    a = load_supervisor(client, job)
    assert controller.reconcile_job(job, a, client, view, reconcile_slot(job, a))
    green_row = Replica.objects.get(replica_id=Replica.full_id(job.key, "topn-2"))
    assert green_row.state == Replica.State.STARTING  # its start was sent to the node agent
    b = load_supervisor(client, job)
    assert b.upgrade is not None and b.upgrade.green == "topn-2"
    assert controller.reconcile_job(job, b, client, view, reconcile_slot(job, b))
    upgrade.refresh_from_db()
    assert upgrade.status == "starting"
    green_row.refresh_from_db()
    assert green_row.state == Replica.State.STARTING


def test_an_upgrade_whose_wake_up_was_lost_is_started_from_the_database(client, users):
    """The controller looked at the job (nothing to start yet), then the state check decided
    the case, and its wake-up never reached the reconcile (consumed by one that failed, sent
    while no controller held the job): the membership round's read of the database finds it."""
    job = running_job()
    running_supervisor(job, client, time.time())
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    ctl = fleet.FleetController(1, client=redis_client(), owner="ctl-t")
    try:
        ctl.settle_membership()  # takes the job
        assert ctl.held() == [job.key]
        slot = ctl.slots[job.key]
        slot.next_cycle = time.monotonic() + 3600
        ctl.reconcile(job.key)  # looks: not checked yet, nothing starts
        JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
        ctl.reconcile(job.key)  # no wake-up: nothing says to look
        upgrade.refresh_from_db()
        assert upgrade.status == "requested"
        ctl.settle_membership()  # reads which held jobs have an upgrade under way
        ctl.reconcile(job.key)
        upgrade.refresh_from_db()
        assert (upgrade.status, upgrade.green_replica) == ("starting", "topn-2")
        assert load_supervisor(client, job).upgrade.upgrade_id == upgrade.pk
    finally:
        ctl.stop()


def test_a_state_check_that_cannot_run_refuses_the_upgrade_with_the_reason(client, users):
    """A record from before parameter values were bounded: a value of 200 KiB makes the dry
    run's exec fail (E2BIG). The upgrade ends refused, and the job may be upgraded again."""
    job = running_job()
    running_supervisor(job, client, time.time())
    upgrade = JobUpgrade.objects.create(
        job=job, from_topology="topn", to_topology="topn", to_params={"topn.n": "9" * 200_000},
        from_strategy=job.strategy, to_strategy=job.strategy,
    )  # fmt: skip
    upgrade_state_check.check_upgrade(upgrade, client)
    upgrade.refresh_from_db()
    assert (upgrade.status, upgrade.case) == ("refused", "refused")
    assert upgrade.outcome.startswith("the state check failed: OSError")
    assert "Argument list too long" in upgrade.outcome
    assert job.decisions.filter(kind=ControlDecision.Kind.UPGRADE, reason__contains="refused")
    assert upgrades.request_upgrade(job, params={"topn.n": 4}, user=users[OPERATOR]).pk


def test_an_upgrade_whose_state_check_never_reported_is_refused_after_the_deadline(client, users):
    """The check's task was lost (a worker killed mid-check, a queue flushed): no verdict can
    come once the task would have expired unstarted and been killed if started."""
    job = running_job()
    now = time.time()
    sup = running_supervisor(job, client, now)
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    assert upgrade_control.reconcile_upgrade(job, sup, now + 60) == []  # the check may still report
    upgrade.refresh_from_db()
    assert upgrade.status == "requested"
    assert upgrade_control.reconcile_upgrade(job, sup, now + 15 * 60) == []
    upgrade.refresh_from_db()
    assert upgrade.status == "refused" and sup.upgrade is None
    assert upgrade.outcome.startswith("the state check did not report within 840 s")
    assert upgrades.request_upgrade(job, params={"topn.n": 4}, user=users[OPERATOR]).pk


def test_an_oversized_parameter_value_is_refused_at_the_request_naming_the_field(api_as):
    job = running_job()
    response = api_as(OPERATOR).post(
        f"/api/jobs/{job.pk}/upgrade/", {"params": {"topn.n": "9" * (128 * 1024 + 1)}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 400, response.status_code
    errors = response.json()["error"]["detail"]
    assert list(errors) == ["params"]
    assert "'topn.n' is 131073 characters long; a value has at most 256" in errors["params"][0]
    assert not JobUpgrade.objects.exists()


def test_a_state_check_whose_controller_died_is_sent_again_at_once(client, users, monkeypatch):
    """Seen in the fleet simulator's chaos run: the controller running an upgrade's check was
    SIGKILLed; its task, acknowledged late, would come back only after the broker's visibility
    timeout (an hour), and the upgrade stayed `requested` until the 840 s deadline refused it."""
    job = running_job()
    now = time.time()
    sup = running_supervisor(job, client, now)
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    sent = []
    monkeypatch.setattr(tasks, "send", lambda task, *args, **kw: sent.append((task, args)))
    runner_key = keys.upgrade_check_runner(job.key, upgrade.pk)
    leases.heartbeat(client, "ctl-checking")
    client.set(runner_key, "ctl-checking")
    assert upgrade_control.reconcile_upgrade(job, sup, now + 5, client) == []
    assert sent == []  # its runner is alive: the check may still report
    client.zrem(keys.controllers(), "ctl-checking")  # killed: it says nothing any more
    assert upgrade_control.reconcile_upgrade(job, sup, now + 6, client) == []
    assert sent == [(tasks.CHECK_UPGRADE, (upgrade.pk,))]
    assert not client.exists(runner_key)
    assert upgrade_control.reconcile_upgrade(job, sup, now + 7, client) == []
    assert len(sent) == 1  # once
    upgrade.refresh_from_db()
    assert upgrade.status == "requested"
    assert job.decisions.filter(reason__contains="ctl-checking, which is gone").count() == 1


def test_a_check_says_who_runs_it_while_it_runs(client, users, monkeypatch):
    job = running_job()
    sup = running_supervisor(job, client, time.time())
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    runner_key = keys.upgrade_check_runner(job.key, upgrade.pk)
    seen = []

    def dry_run_that_looks(upgrade, supervisor, stage, blue):
        seen.append(client.get(runner_key))
        raise OSError("no dry run here")

    monkeypatch.setattr(upgrade_state_check, "dry_run", dry_run_that_looks)
    upgrade_state_check.check_upgrade(upgrade, client, runner="ctl-a")
    assert seen == ["ctl-a"] and not client.exists(runner_key)
    assert sup.upgrade is None
