"""Blue/green upgrades of a running stage, driven with synthetic events (no processes, no Redis):
spark_runtime/upgrade.py through the Supervisor."""

from __future__ import annotations

import json

import pytest

from spark_runtime import upgrade as upgrades
from spark_runtime.replicas import (
    HeartbeatSeen,
    KillReplica,
    ProcessExited,
    PromoteStandby,
    StartReplica,
)
from spark_runtime.supervision import Supervisor
from spark_runtime.upgrade import DemoteReplica, UpgradeRefused

NODES = ["node-1", "node-2", "node-3"]


def protected_job() -> Supervisor:
    """wordcount under active-all: split-1, split-2 (standby), count-1, count-2 (standby)."""
    sup = Supervisor(
        "j", "wordcount", {"split": ("split",), "count": ("count",)}, "active-all", NODES,
        params=("count.window_s=10",),
    )  # fmt: skip
    sup.start(0.0)
    for replica in list(sup.replicas.values()):
        beat(sup, replica.id, 1.0, replica.role)
    return sup


def beat(sup, replica_id, at, role, state="running", lag_s=0.5, batches=3, **more):
    """A heartbeat of `replica_id` saying what it is; 3 batches run and (a standby) 0.5 s behind
    by default."""
    reported = {"role": role, "state": state, "lag_s": lag_s, "batches": batches, **more}
    return sup.handle(HeartbeatSeen(replica_id, at, reported))


def begin(sup, seeded=True, at=10.0):
    return upgrades.begin(sup, 7, "count", "wordcount", ("count.window_s=20",), seeded, at)


def test_a_green_that_reports_it_took_over_before_blue_reports_its_demotion_has_switched():
    """Blue passes the promotion on itself (DemoteReplica.successor): green's report as the
    primary may be seen first."""
    sup = protected_job()
    begin(sup)
    beat(sup, "count-3", 12.0, "standby")
    assert sup.upgrade.phase == upgrades.HANDING_OVER
    # The stage's ordinary standby goes; no promote command: green is the primary already.
    assert beat(sup, "count-3", 12.3, "primary", batches=5) == [KillReplica("count-2")]
    assert sup.upgrade.phase == upgrades.VALIDATING and sup.upgrade.switched_at == 12.3
    assert sup.upgrade.green_batches_at_switch == 5
    assert beat(sup, "count-1", 12.5, "standby") == []  # its report comes later: nothing to do
    assert sup.topology == "wordcount" and sup.params == ("count.window_s=20",)


def switched(sup) -> Supervisor:
    """Run an upgrade of `count` up to VALIDATING: green is count-3."""
    begin(sup)
    beat(sup, "count-3", 12.0, "standby")
    beat(sup, "count-1", 12.5, "standby")
    beat(sup, "count-3", 13.0, "primary")
    assert sup.upgrade.phase == upgrades.VALIDATING
    return sup


def test_green_starts_seeded_takes_over_at_a_batch_boundary_and_blue_retires_on_confirm():
    sup = protected_job()
    (start,) = begin(sup)
    green = start.replica
    assert (green.replica_id, green.role, green.seed_from) == ("count-3", "standby", "count-1")
    assert green.params == ("count.window_s=20",)
    assert green.node != sup.replicas["count-1"].spec.node
    # A successor: never paced down as a caught-up standby is (it would take over behind).
    assert green.successor and "--successor" in green.argv()
    # Catching up: nothing happens; the stage's ordinary standby is still count-2.
    assert beat(sup, "count-3", 11.0, "standby", state="catching_up") == []
    # Running but with no lag measured yet (its first batch runs), or too far behind: not yet.
    assert beat(sup, "count-3", 11.2, "standby", lag_s=None) == []
    assert beat(sup, "count-3", 11.5, "standby", lag_s=upgrades.SWITCH_LAG_S + 1) == []
    assert sup.standby_of("count").id == "count-2"
    # Caught up: blue hands over.
    assert beat(sup, "count-3", 12.0, "standby") == [
        DemoteReplica("count-1", "count", successor="count-3")
    ]
    # Until blue says it is a standby, green is not promoted.
    assert beat(sup, "count-1", 12.2, "primary") == []
    actions = beat(sup, "count-1", 12.5, "standby")
    assert actions == [PromoteStandby("count-3", "count"), KillReplica("count-2")]
    assert beat(sup, "count-3", 13.0, "primary") == []
    assert sup.upgrade.phase == upgrades.VALIDATING and sup.upgrade.switched_at == 13.0
    # New replicas of the stage run the new parameters from now on.
    assert sup.params == ("count.window_s=20",)
    assert sup.replicas["count-3"].role == "primary"
    # Restarted later (a failure), green is an ordinary primary.
    assert not sup.replicas["count-3"].spec.successor
    assert sup.replicas["count-1"].role == "standby"
    actions = upgrades.confirm(sup, 70.0, "validated for 57 s")
    kill, standby = actions
    assert kill == KillReplica("count-1")
    assert isinstance(standby, StartReplica) and standby.replica.role == "standby"
    assert standby.replica.params == ("count.window_s=20",)
    assert sup.upgrade.phase == upgrades.CONFIRMED
    assert any("upgrade 7 confirmed" in what for _, what in sup.history)


def test_a_green_that_crashes_after_the_switch_hands_the_output_back_to_blue():
    sup = switched(protected_job())
    actions = sup.handle(ProcessExited("count-3", 20.0, 1, cause="ZeroDivisionError: boom"))
    assert actions == [KillReplica("count-3"), PromoteStandby("count-1", "count")]
    assert sup.upgrade.phase == upgrades.ROLLED_BACK
    assert "ZeroDivisionError" in sup.upgrade.outcome
    assert sup.params == ("count.window_s=10",)
    # Blue reports primary again; the stage gets an ordinary standby of the old version.
    (start,) = beat(sup, "count-1", 21.0, "primary")
    assert start.replica.role == "standby" and start.replica.params == ("count.window_s=10",)
    assert sup.replicas["count-1"].role == "primary"


def test_a_rollback_by_hand_while_validating_promotes_blue_again():
    sup = switched(protected_job())
    actions = upgrades.roll_back(sup, 30.0, "rolled back by operator")
    assert actions == [KillReplica("count-3"), PromoteStandby("count-1", "count")]
    with pytest.raises(UpgradeRefused, match="no upgrade of this job is under way"):
        upgrades.roll_back(sup, 31.0, "again")


def test_a_green_that_fails_before_the_switch_just_goes():
    sup = protected_job()
    begin(sup)
    actions = sup.handle(ProcessExited("count-3", 11.0, 1, cause="StateSchemaNotCompatible"))
    assert actions == [KillReplica("count-3")]
    assert sup.upgrade.phase == upgrades.ROLLED_BACK
    assert sup.replicas["count-1"].role == "primary" and sup.standby_of("count").id == "count-2"


def test_a_green_whose_promotion_fails_rolls_back():
    sup = protected_job()
    begin(sup)
    beat(sup, "count-3", 12.0, "standby")
    beat(sup, "count-1", 12.5, "standby")
    actions = beat(sup, "count-3", 13.0, "standby", state="promote_failed", error="buffer gap")
    assert actions == [KillReplica("count-3"), PromoteStandby("count-1", "count")]
    assert "buffer gap" in sup.upgrade.outcome


def test_when_blue_fails_before_the_switch_its_ordinary_standby_takes_over_not_green():
    sup = protected_job()
    begin(sup)
    actions = sup.handle(ProcessExited("count-1", 11.0, -9))
    assert actions == [
        KillReplica("count-3"),
        KillReplica("count-1"),
        PromoteStandby("count-2", "count"),
    ]
    assert sup.upgrade.phase == upgrades.ABANDONED


def test_blue_dying_while_it_hands_over_lets_green_take_over_and_ends_the_rollback_option():
    sup = protected_job()
    begin(sup)
    beat(sup, "count-3", 12.0, "standby")
    actions = sup.handle(ProcessExited("count-1", 12.3, -9))
    assert actions == [PromoteStandby("count-3", "count"), KillReplica("count-2")]
    # Green took over with nothing to roll back to: confirmed at once, and the stage gets an
    # ordinary standby again (it ran unprotected since count-2 went).
    (standby,) = beat(sup, "count-3", 13.0, "primary")
    assert isinstance(standby, StartReplica) and standby.replica.role == "standby"
    assert sup.upgrade.phase == upgrades.CONFIRMED and "no rollback" in sup.upgrade.outcome
    with pytest.raises(UpgradeRefused, match="under way"):
        upgrades.roll_back(sup, 14.0, "by hand")


def test_blue_dying_while_validating_confirms_the_upgrade_and_protects_the_stage_again():
    sup = switched(protected_job())
    (standby,) = sup.handle(ProcessExited("count-1", 20.0, -9))
    assert isinstance(standby, StartReplica) and standby.replica.role == "standby"
    assert standby.replica.params == ("count.window_s=20",)
    assert sup.upgrade.phase == upgrades.CONFIRMED


def test_one_upgrade_at_a_time_and_no_confirm_before_the_switch():
    sup = protected_job()
    begin(sup)
    with pytest.raises(UpgradeRefused, match="under way"):
        begin(sup)
    with pytest.raises(UpgradeRefused, match="has not switched yet"):
        upgrades.confirm(sup, 11.0, "too soon")


def test_an_upgrade_survives_a_snapshot_in_every_phase():
    sup = protected_job()
    begin(sup)
    beat(sup, "count-3", 12.0, "standby")
    restored = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    assert restored.upgrade == sup.upgrade
    assert restored.upgrade.apart() == {"count-1", "count-3"}
    actions = beat(restored, "count-1", 12.5, "standby")
    assert actions == [PromoteStandby("count-3", "count"), KillReplica("count-2")]


def test_the_stop_and_restart_baseline_restarts_every_replica_of_the_stage_in_place():
    sup = protected_job()
    actions = upgrades.restart_in_place(sup, 8, "count", "wordcount", ("count.window_s=20",), 10.0)
    assert [a.replica.replica_id for a in actions] == ["count-1", "count-2"]
    assert all(a.replica.params == ("count.window_s=20",) for a in actions)
    assert all(sup.replicas[r].state == "starting" for r in ("count-1", "count-2"))
    assert sup.upgrade.phase == upgrades.CONFIRMED and sup.upgrade.mode == upgrades.STOP_RESTART
    assert sup.params == ("count.window_s=20",)


def test_the_baseline_restarts_in_new_processes_and_later_restarts_take_spares_again():
    """Other consoles start a new JVM: the baseline takes no warm spare, whatever the strategy;
    the replicas' own restarts afterwards do again (adaptive's warm spares)."""
    sup = Supervisor("j", "wordcount", {"count": ("split", "count")}, "adaptive", NODES)
    sup.start(0.0)
    beat(sup, "count-1", 1.0, "primary")
    assert sup.replicas["count-1"].spec.warm
    (restart,) = upgrades.restart_in_place(sup, 8, "count", "wordcount", (), 10.0)
    assert restart.replica.replica_id == "count-1" and not restart.replica.warm
    assert sup.replicas["count-1"].spec.warm


def test_the_policy_adds_no_standby_to_a_stage_being_upgraded():
    sup = protected_job()
    begin(sup)
    beat(sup, "count-3", 12.0, "standby")
    beat(sup, "count-1", 12.5, "standby")  # the ordinary standby count-2 goes here
    assert not sup.has_standby("count")
    assert sup.add_standby("count", "node-3", 13.0) == []
    assert sup.move_standby("count", "node-3", 13.0) == []
    assert sup.add_standby("split", "node-3", 13.0) == []  # it has one: unchanged behaviour


def test_green_failing_after_blue_died_is_restarted_as_the_stages_primary():
    sup = switched(protected_job())
    sup.handle(ProcessExited("count-1", 20.0, -9))  # confirmed: green stays, a standby starts
    actions = sup.handle(ProcessExited("count-3", 25.0, 1))
    # The ordinary failover: the new standby is not caught up yet, so green restarts.
    assert [type(a).__name__ for a in actions] == ["RestartStage"]
    assert actions[0].replica.replica_id == "count-3" and actions[0].replica.role == "primary"
    assert sup.upgrade.phase == upgrades.CONFIRMED


def test_a_rollback_whose_promotion_fails_restarts_green_rather_than_leave_no_writer():
    sup = switched(protected_job())
    upgrades.roll_back(sup, 30.0, "by hand")
    actions = beat(sup, "count-1", 31.0, "standby", state="promote_failed", error="gap")
    restarts = [a for a in actions if type(a).__name__ == "RestartStage"]
    assert [a.replica.replica_id for a in restarts] == ["count-3"]


# -- validation: green judged against blue's output before the upgrade -------------------------


def validating(latency_limit_ms=800.0, dead_letters=0) -> Supervisor:
    sup = protected_job()
    upgrades.begin(
        sup, 7, "count", "wordcount", ("count.window_s=20",), True, 10.0,
        upgrades.BlueNormal(latency_limit_ms, dead_letters),
    )  # fmt: skip
    beat(sup, "count-3", 12.0, "standby")
    beat(sup, "count-1", 12.5, "standby")
    beat(sup, "count-3", 30.0, "primary")  # switched at 30: 20 s after the start
    return sup


def seen(p90_ms, dead_letters=0, band=0.15):
    return upgrades.GreenSeen(tuple(p90_ms), dead_letters, band)


def test_green_latency_above_blues_band_for_the_whole_window_fails_its_validation():
    machine = validating().upgrade
    slow = [900.0] * 10
    # Not before a whole window after the switch's grace: the switch's own gap is no symptom.
    assert upgrades.validation_failure(machine, seen(slow), 49.0) is None
    why = upgrades.validation_failure(machine, seen(slow), 50.0)
    assert why is not None and "0.90 s" in why and "0.80 s" in why
    # One slow second in ten is not: the mean is in band.
    assert upgrades.validation_failure(machine, seen([400.0] * 9 + [3000.0]), 50.0) is None
    # No band learned (too little output before the upgrade): latency is not judged.
    unknown = validating(latency_limit_ms=None).upgrade
    assert upgrades.validation_failure(unknown, seen(slow), 50.0) is None


def test_green_dead_lettering_more_than_blues_rate_allows_fails_its_validation():
    # Blue dead-lettered 20 entries in the 20 s from the start to the switch: 1 per second.
    machine = validating(dead_letters=100).upgrade
    fine = [100.0] * 10
    assert upgrades.validation_failure(machine, seen(fine, dead_letters=120), 30.0) is None
    assert machine.dead_letters_at_switch == 120  # noted by the first check after the switch
    # 20 s later: 20 * 1.15 + 5 = 28 allowed.
    assert upgrades.validation_failure(machine, seen(fine, dead_letters=148), 50.0) is None
    why = upgrades.validation_failure(machine, seen(fine, dead_letters=149), 50.0)
    assert why is not None and "29 input entries" in why and "allows 28" in why


def test_validation_state_survives_a_snapshot():
    sup = validating(dead_letters=3)
    upgrades.validation_failure(sup.upgrade, seen([100.0], dead_letters=4), 31.0)
    again = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    assert (again.upgrade.latency_limit_ms, again.upgrade.dead_letters_at_start) == (800.0, 3)
    assert again.upgrade.dead_letters_at_switch == 4


def test_green_counts_as_having_run_once_it_ran_a_batch_as_the_primary():
    sup = protected_job()
    begin(sup)
    beat(sup, "count-3", 12.0, "standby", lag_s=0.0, batches=0)  # idle input: caught up
    beat(sup, "count-1", 12.5, "standby")
    beat(sup, "count-3", 13.0, "primary", batches=0)
    machine = sup.upgrade
    assert machine.phase == upgrades.VALIDATING and not machine.green_ran_since_switch
    beat(sup, "count-3", 14.0, "primary", batches=0)
    assert not machine.green_ran_since_switch
    beat(sup, "count-3", 15.0, "primary", batches=1)
    assert machine.green_ran_since_switch


def test_a_result_preserving_upgrade_rolls_back_on_a_difference_blue_reports():
    """Declared result-preserving: blue is told to compare as it hands over, its heartbeats
    carry what it found (spark_runtime/result_check.py), and a difference fails validation."""
    sup = protected_job()
    upgrades.begin(
        sup, 7, "count", "wordcount", ("count.window_s=20",), True, 10.0, compare_results=True
    )
    assert beat(sup, "count-3", 12.0, "standby") == [
        DemoteReplica("count-1", "count", successor="count-3", compare=True)
    ]
    beat(sup, "count-1", 12.5, "standby")
    beat(sup, "count-3", 13.0, "primary")
    machine = sup.upgrade
    assert machine.phase == upgrades.VALIDATING and not machine.results_checked
    equal = {"compared": 40, "differing": 0, "examples": []}
    beat(sup, "count-1", 14.0, "standby", result_check=equal)
    assert machine.results_checked
    assert upgrades.validation_failure(machine, seen([100.0]), 15.0) is None
    example = "results 'spark': old 4, new 5"
    found = {"compared": 52, "differing": 2, "examples": [example]}
    beat(sup, "count-1", 16.0, "standby", result_check=found)
    again = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    assert again.upgrade.results_examples == (example,)
    why = upgrades.validation_failure(machine, seen([100.0]), 16.5)
    assert why is not None and "on 2 of 52 keys both computed" in why and example in why
    actions = upgrades.roll_back(sup, 16.5, why)
    assert PromoteStandby("count-1", "count") in actions
    assert sup.upgrade.phase == upgrades.ROLLED_BACK and sup.params == ("count.window_s=10",)


def test_an_upgrade_not_declared_result_preserving_ignores_what_blue_compares():
    machine = validating().upgrade
    machine.results_differing, machine.results_compared = 3, 10
    assert machine.results_checked
    assert upgrades.validation_failure(machine, seen([100.0]), 31.0) is None


def test_a_stage_without_results_to_compare_is_confirmed_without_the_check():
    sup = protected_job()
    upgrades.begin(
        sup, 7, "count", "wordcount", ("count.window_s=20",), True, 10.0, compare_results=True
    )
    beat(sup, "count-3", 12.0, "standby")
    beat(sup, "count-1", 12.5, "standby")
    beat(sup, "count-3", 13.0, "primary")
    assert not sup.upgrade.results_checked
    nothing = {"comparable": False, "compared": 0, "differing": 0, "examples": []}
    beat(sup, "count-1", 14.0, "standby", result_check=nothing)
    assert sup.upgrade.results_checked
