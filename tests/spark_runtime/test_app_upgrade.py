"""Upgrading an existing app (spark_runtime/upgrade.py, APP_RESTART) through the Supervisor,
driven with synthetic events (no processes, no Redis): stop, start from the same checkpoints,
validate, else roll back."""

from __future__ import annotations

import json

import pytest

from spark_runtime import upgrade as upgrades
from spark_runtime.replicas import HeartbeatMissed, HeartbeatSeen, ProcessExited, RestartStage
from spark_runtime.supervision import Supervisor
from spark_runtime.upgrade import StopApp, UpgradeRefused

NODES = ["node-1", "node-2"]


def running_app() -> Supervisor:
    """An app's job (restart-all, one stage `job` of the operator `app`), its replica running."""
    sup = Supervisor("j", "windows@1", {"job": ("app",)}, "restart-all", NODES)
    sup.start(0.0)
    (replica,) = sup.replicas
    assert replica == "job-1"
    beat(sup, 1.0, batches=4)
    return sup


def beat(sup, at, batches=0, per_query=None, state="running"):
    """A heartbeat of job-1; `per_query`: the batches each query of the app completed."""
    reported = {"role": "primary", "state": state, "batches": batches, "started_at": at - 0.5,
                "query_batches": per_query or {}}  # fmt: skip
    return sup.handle(HeartbeatSeen("job-1", at, reported))


def stopped(sup, at=12.0) -> list:
    """The old version has stopped its queries and exited, as asked."""
    return sup.handle(ProcessExited("job-1", at, 0))


def test_the_old_version_stops_then_the_new_one_starts_on_the_same_checkpoints_and_is_confirmed():
    sup = running_app()
    actions = upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    assert actions == [StopApp("job-1", 10.0)]
    assert sup.upgrade.phase == upgrades.HANDING_OVER
    assert sup.upgrade.mode == upgrades.APP_RESTART
    assert sup.topology == "windows@1"  # until the new version is launched
    # The stopping app's heartbeats change nothing.
    assert beat(sup, 11.0, batches=5) == []
    (restart,) = stopped(sup)
    # The same replica (its checkpoint directory), the new version, no failure counted.
    assert isinstance(restart, RestartStage)
    assert (restart.replica.replica_id, restart.replica.topology) == ("job-1", "windows@2")
    assert sup.upgrade.phase == upgrades.VALIDATING and sup.upgrade.switched_at == 12.0
    assert sup.topology == "windows@2"
    assert sup.replicas["job-1"].failures_in_a_row == 0
    assert not sup.failures.get("job/primary")
    # One query's batches say nothing of the other's state (the one Spark may refuse): each
    # query must complete a batch.
    beat(sup, 30.0, batches=3, per_query={"totals": 0, "large": 3})
    assert upgrades.app_tick(sup, 30.0) == []
    beat(sup, 33.0, batches=4, per_query={"totals": 1, "large": 3})
    assert upgrades.app_tick(sup, 33.0) == []
    assert sup.upgrade.phase == upgrades.CONFIRMED
    assert sup.upgrade.outcome == (
        "each query of the new version (large, totals) completed a batch from the checkpoints, "
        "21 s after its launch"
    )
    assert sup.topology == "windows@2" and "job-1" in sup.replicas


def test_a_heartbeat_of_the_old_run_does_not_count_toward_the_new_versions_batches():
    sup = running_app()
    upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    stopped(sup)
    # The old process's last heartbeat (it started at 0.5), read after the relaunch at 12.0.
    reported = {"role": "primary", "state": "running", "batches": 40, "started_at": 0.5,
                "query_batches": {"counts": 40}}  # fmt: skip
    sup.handle(HeartbeatSeen("job-1", 12.5, reported))
    assert sup.upgrade.green_batches == 0 and sup.upgrade.app_query_batches == {}
    assert upgrades.app_tick(sup, 13.0) == [] and sup.upgrade.phase == upgrades.VALIDATING


def test_a_new_version_that_fails_on_start_rolls_back_to_the_old_one_on_its_checkpoints():
    sup = running_app()
    upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    stopped(sup)
    cause = "apps/windows.py line 9: RuntimeError: no such column"
    (restart,) = sup.handle(ProcessExited("job-1", 30.0, 1, cause=cause))
    assert (restart.replica.replica_id, restart.replica.topology) == ("job-1", "windows@1")
    assert sup.upgrade.phase == upgrades.ROLLED_BACK
    assert cause in sup.upgrade.outcome
    assert sup.topology == "windows@1"
    # The rollback is no failure of the old version: no backoff, nothing toward giving up.
    assert not sup.failures.get("job/primary") and sup.gave_up is None
    # Later failures are the ordinary supervision's again.
    beat(sup, 40.0, batches=1)
    assert sup.handle(HeartbeatMissed("job-1", 80.0)) != []
    assert sup.failures.get("job/primary")


def test_a_new_version_without_its_first_batches_in_time_is_rolled_back():
    """The bound counts from the new version's start (its script runs), not from its launch:
    a slow JVM and session start on a loaded machine is no fault of the new version."""
    sup = running_app()
    upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    stopped(sup)
    bound = upgrades.APP_FIRST_BATCHES_WITHIN_S
    beat(sup, 100.0, state="starting")  # the session still coming up
    assert upgrades.app_tick(sup, 12.0 + bound) == []
    beat(sup, 150.0, batches=1, per_query={"counts": 0, "large": 1})
    assert upgrades.app_tick(sup, 150.0 + bound - 1) == []
    (restart,) = upgrades.app_tick(sup, 150.0 + bound)
    assert restart.replica.topology == "windows@1"
    assert sup.upgrade.phase == upgrades.ROLLED_BACK
    assert sup.upgrade.outcome == (
        "the new version's queries had not each completed a batch within 300 s of its start "
        "(batches: counts 0, large 1)"
    )


def test_a_new_version_whose_app_never_starts_is_rolled_back():
    sup = running_app()
    upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    stopped(sup)
    beat(sup, 100.0, state="starting")
    assert upgrades.app_tick(sup, 12.0 + upgrades.APP_START_WITHIN_S - 1) == []
    (restart,) = upgrades.app_tick(sup, 12.0 + upgrades.APP_START_WITHIN_S)
    assert restart.replica.topology == "windows@1"
    assert sup.upgrade.outcome == "the new version's app had not started 600 s after its launch"


def test_an_old_version_that_does_not_stop_in_time_is_killed_and_the_new_one_starts():
    sup = running_app()
    upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    assert upgrades.app_tick(sup, 10.0 + upgrades.APP_STOP_WITHIN_S - 1) == []
    (restart,) = upgrades.app_tick(sup, 10.0 + upgrades.APP_STOP_WITHIN_S)
    # A restart: the agent kills what is left of the old process before it starts the new one.
    assert isinstance(restart, RestartStage) and restart.replica.topology == "windows@2"
    assert sup.upgrade.phase == upgrades.VALIDATING
    assert any("had not stopped" in what for _, what in sup.history)


def test_a_rollback_by_hand_restarts_the_old_version_and_a_confirm_ends_it_at_once():
    sup = running_app()
    upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    with pytest.raises(UpgradeRefused):
        upgrades.confirm(sup, 11.0, "by hand")  # nothing to confirm before the new one runs
    stopped(sup)
    (restart,) = upgrades.roll_back(sup, 20.0, "rolled back by opal")
    assert restart.replica.topology == "windows@1" and sup.upgrade.phase == upgrades.ROLLED_BACK

    again = running_app()
    upgrades.begin_app_restart(again, 6, "job", "windows@2", 10.0)
    stopped(again)
    assert upgrades.confirm(again, 20.0, "confirmed by opal") == []
    assert again.upgrade.phase == upgrades.CONFIRMED and "job-1" in again.replicas


def test_an_app_upgrade_goes_on_from_a_snapshot_in_every_phase():
    """A controller killed mid-upgrade: its successor loads the saved state and goes on."""
    sup = running_app()
    upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    restored = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    assert restored.upgrade == sup.upgrade
    (restart,) = stopped(restored)
    assert restart.replica.topology == "windows@2"
    restored = Supervisor.from_dict(json.loads(json.dumps(restored.to_dict())))
    beat(restored, 30.0, batches=2, per_query={"counts": 2})
    restored = Supervisor.from_dict(json.loads(json.dumps(restored.to_dict())))
    assert restored.upgrade.app_query_batches == {"counts": 2}
    upgrades.app_tick(restored, 30.0)
    assert restored.upgrade.phase == upgrades.CONFIRMED


def test_an_app_upgrade_needs_the_app_running_and_none_under_way():
    sup = running_app()
    upgrades.begin_app_restart(sup, 5, "job", "windows@2", 10.0)
    with pytest.raises(UpgradeRefused, match="under way"):
        upgrades.begin_app_restart(sup, 6, "job", "windows@3", 11.0)
    fresh = Supervisor("j", "windows@1", {"job": ("app",)}, "restart-all", NODES)
    fresh.start(0.0)
    with pytest.raises(UpgradeRefused, match="no running app"):
        upgrades.begin_app_restart(fresh, 7, "job", "windows@2", 1.0)


def test_the_app_reports_each_started_querys_batches_by_name():
    """What an app's stage puts in its heartbeat for the validation (spark_runtime/app_stage)."""
    from spark_runtime.app_stage import AppRun
    from spark_runtime.apps import AppDefinition

    run = AppRun(None, AppDefinition("w", "apps/w.py", "pass"), [])
    run.query_started("id-1", "totals")
    run.query_started("id-2", None)
    assert run.batches_by_query() == {"totals": 0, "query-2": 0}
    run.batch_done("id-2")
    run.batch_done("id-2")
    assert run.batches_by_query() == {"totals": 0, "query-2": 2}
