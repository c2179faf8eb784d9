"""Upgrades against the races around them (issue 58): an operator's request made while the
controller's reconcile or the state check holds an older copy of the record. Real database and
Redis; each interleaving is played by calling the steps in order (what the reconcile reads,
what the operator asks, what the reconcile writes)."""

from __future__ import annotations

import json
import time

import pytest

from console.models import Job, JobUpgrade, Policy
from console.redis import redis_client
from console.roles import OPERATOR
from console.services import upgrades
from console.services.control.observe import save_supervisor
from spark_runtime import keys as data_keys
from spark_runtime.supervision import HeartbeatSeen, KillReplica, PromoteStandby, Supervisor
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


# --- defect 3: an operator's request is never overwritten by the controller -----------------


def test_a_rollback_asked_while_a_reconcile_holds_its_copy_survives_the_reconciles_write(
    client, users, api_as
):
    job = running_job()
    now = time.time()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    sup = running_supervisor(job, client, now)
    upgrades.reconcile_upgrade(job, sup, now)  # green topn-2 starts: the record says starting
    switch(sup, "topn-2", "topn-1", now + 1)
    assert sup.upgrade.phase == "validating"
    # The reconcile reads its copy of the record (still `starting`)...
    copy = job.upgrades.filter(status__in=JobUpgrade.UNDER_WAY).first()
    # ... the operator asks for a rollback, and is told it is accepted...
    response = api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/rollback/")
    assert response.status_code == 202
    # ... and the reconcile writes the phase it saw.
    upgrades.record_phase(job, copy, sup)
    upgrade.refresh_from_db()
    assert upgrade.status == "validating"
    assert (upgrade.requested_action, upgrade.ended_by_id) == ("rollback", users[OPERATOR].pk)
    # The next reconcile carries the rollback out.
    actions = upgrades.reconcile_upgrade(job, sup, now + 2)
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
    upgrades.refuse(copy, "topn", "Spark refuses the new version: AnalysisException")
    refused.refresh_from_db()
    assert (refused.status, refused.outcome) == ("abandoned", "cancelled before it started by otto")
    assert refused.ended_by.username == "otto" and refused.case == ""
    # The same with a check that finds the upgrade possible: the case is not written either.
    checked = upgrades.request_upgrade(job, params={"topn.n": 4}, user=users[OPERATOR])
    copy = JobUpgrade.objects.get(pk=checked.pk)
    api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{checked.pk}/rollback/")
    copy.stage, copy.case, copy.reason = "topn", JobUpgrade.Case.SEEDED, "compatible"
    assert not upgrades.record_case(copy)
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
    actions = upgrades.begin(copy, sup, now)
    upgrades.record_phase(job, copy, sup)
    assert actions == [] and sup.upgrade is None and set(sup.replicas) == {"topn-1"}
    upgrade.refresh_from_db()
    assert (upgrade.status, upgrade.outcome) == ("abandoned", "cancelled before it started by otto")
    assert upgrade.green_replica == ""


def test_an_abandon_keeps_an_end_written_meanwhile(client, users, api_as):
    job = running_job()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    copy = JobUpgrade.objects.get(pk=upgrade.pk)  # a reconcile whose start will be refused
    api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/rollback/")
    upgrades.abandon(copy, "could not start: stage topn has no running primary to upgrade")
    upgrade.refresh_from_db()
    assert upgrade.outcome == "cancelled before it started by otto"
    assert upgrade.ended_by.username == "otto"
    assert not job.decisions.filter(reason__contains="abandoned").exists()
