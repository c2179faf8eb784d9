"""CPU priority of stage and spare processes: the lower priority holds across sessions (what
it gives a process is measured in tests/bench/dataplane/test_cpu_priority.py)."""

import os
from pathlib import Path

import pytest

from spark_runtime import cpu_priority

autogroups = pytest.mark.skipif(
    not os.path.exists(cpu_priority.AUTOGROUP), reason="kernel without autogroups"
)


@autogroups
def test_a_process_sharing_its_session_leaves_the_autogroup_alone():
    # The test runner is not its session's leader (or is the shell's): its autogroup is shared
    # with other processes, and set_group_nice must not lower them all.
    if os.getsid(0) == os.getpid():
        pytest.skip("this process leads its session")
    before = Path(cpu_priority.AUTOGROUP).read_text()
    original = os.getpriority(os.PRIO_PROCESS, 0)
    pid = os.fork()
    if pid == 0:  # the child shares the session and the process group's nice level
        os.setpgid(0, 0)  # its own process group, so setpriority(PRIO_PGRP) stays in it
        cpu_priority.set_group_nice(original + 1)
        os._exit(0 if Path(cpu_priority.AUTOGROUP).read_text() == before else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_autogroup_level_is_read_and_a_root_group_has_none(tmp_path):
    # A session of its own reads "/autogroup-N nice L"; init's root group reads empty (a
    # service's processes, CI's), and has no level to set or put back.
    own = tmp_path / "own"
    own.write_text("/autogroup-85 nice -5\n")
    root = tmp_path / "root"
    root.write_text("")
    assert cpu_priority.autogroup_nice(str(own)) == -5
    assert cpu_priority.autogroup_nice(str(root)) is None
    assert cpu_priority.autogroup_nice(str(tmp_path / "absent")) is None
    if os.path.exists("/proc/1/autogroup"):
        assert cpu_priority.autogroup_nice("/proc/1/autogroup") is None


def test_a_primary_runs_above_the_normal_level_and_only_a_caught_up_standby_below_it():
    from spark_runtime.stage import CATCHING_UP, RUNNING, wanted_nice

    assert wanted_nice(True, "primary", RUNNING, started=True) == -5
    assert wanted_nice(True, "primary", RUNNING, started=False) == -5
    assert wanted_nice(True, "standby", RUNNING, started=True) == 5
    # Catching up decides the re-protect time: at the primary's level (docs/RESULTS.md).
    assert wanted_nice(True, "standby", CATCHING_UP, started=True) == 0
    # Starting: Spark's fixed 10 s for the source's Python worker to connect back.
    assert wanted_nice(True, "standby", RUNNING, started=False) == 0
    # A start that missed it and is tried again goes above steady primaries until its first
    # batch; then the usual levels apply.
    assert wanted_nice(True, "standby", RUNNING, started=False, start_retried=True) == -6
    # A primary (which measures no lag, so is never "started") keeps its level.
    assert wanted_nice(True, "primary", RUNNING, started=False, start_retried=True) == -5
    assert wanted_nice(True, "standby", RUNNING, started=True, start_retried=True) == 5
    assert wanted_nice(False, "standby", RUNNING, started=False, start_retried=True) == 0
    # A strategy without CPU priorities (restart-all, local-restart): everything at 0.
    assert wanted_nice(False, "standby", RUNNING, started=True) == 0
    assert wanted_nice(False, "primary", RUNNING, started=True) == 0
    # An upgrade's new version about to take over: at the normal level.
    assert wanted_nice(True, "standby", RUNNING, started=True, successor=True) == 0
    assert wanted_nice(True, "primary", RUNNING, started=True, successor=True) == -5


def test_recovery_first_a_recovering_primary_and_a_reseeding_standby_run_above_steady_work():
    from spark_runtime.stage import (
        CATCHING_UP,
        RUNNING,
        is_recovering,
        recovering_since,
        wanted_nice,
    )
    from spark_runtime.strategies import (
        CONTROL_PLANE_NICE,
        PRIMARY_NICE,
        RECOVERING_NICE,
        RECOVERY_PRIORITY_S,
        REPROTECTING_NICE,
    )

    # The order: control plane, recovering primary, re-protecting standby, steady primaries.
    assert CONTROL_PLANE_NICE < RECOVERING_NICE < REPROTECTING_NICE < PRIMARY_NICE
    assert (
        wanted_nice(True, "primary", RUNNING, True, recovering=True, recovery_first=True)
        == RECOVERING_NICE
    )
    # A recovering primary keeps its class while its start is tried again.
    assert (
        wanted_nice(
            True, "primary", RUNNING, False, recovering=True, recovery_first=True,
            start_retried=True,
        )
        == RECOVERING_NICE
    )  # fmt: skip
    assert wanted_nice(False, "primary", RUNNING, True, recovering=True) == 0  # restart-all
    # local-restart: steady work at the normal level, its restarts in the recovery class.
    local = {"recovery_first": True}
    assert wanted_nice(False, "primary", RUNNING, True, recovering=True, **local) == -8
    assert wanted_nice(False, "primary", RUNNING, True, recovering=False, **local) == 0
    assert wanted_nice(False, "standby", CATCHING_UP, True, seeded=True, **local) == 0
    # A standby seeded from its primary's checkpoint re-protects a stage: above steady work
    # while it catches up, then below its primary as any caught-up standby.
    assert wanted_nice(True, "standby", CATCHING_UP, True, seeded=True) == REPROTECTING_NICE
    assert wanted_nice(True, "standby", CATCHING_UP, True, seeded=False) == 0
    assert wanted_nice(True, "standby", RUNNING, True, seeded=True) == 5
    # Recovering since the promotion, or a restarted primary's start; a first start is not.
    assert recovering_since("primary", 100.0, resumed=False, promoted_at=250.0) == 250.0
    assert recovering_since("primary", 100.0, resumed=True, promoted_at=None) == 100.0
    assert recovering_since("primary", 100.0, resumed=False, promoted_at=None) is None
    assert recovering_since("standby", 100.0, resumed=True, promoted_at=None) is None
    # For RECOVERY_PRIORITY_S, then back to the steady primary's level.
    assert is_recovering(100.0, 100.0 + RECOVERY_PRIORITY_S - 0.1)
    assert not is_recovering(100.0, 100.0 + RECOVERY_PRIORITY_S)
    assert not is_recovering(None, 100.0)


def test_a_restarted_primary_starts_in_the_recovery_class_unless_an_app_or_the_baseline():
    from spark_runtime.stage import starting_nice
    from spark_runtime.strategies import RECOVERING_NICE, STRATEGY_TABLE

    assert starting_nice(True, "primary", resumed=True, app=False) == RECOVERING_NICE
    assert starting_nice(True, "primary", resumed=False, app=False) == 0  # a first start
    assert starting_nice(True, "standby", resumed=True, app=False) == 0
    # An existing app's loop never lowers its level again: it starts at the normal one.
    assert starting_nice(True, "primary", resumed=True, app=True) == 0
    assert starting_nice(False, "primary", resumed=True, app=False) == 0
    # restart-all stays the plain Spark baseline; every other strategy restores service first.
    first = {name: s.recovery_first for name, s in STRATEGY_TABLE.items()}
    assert first == {"restart-all": False, "local-restart": True, "adaptive": True,
                     "active-all": True}  # fmt: skip


def test_a_replica_resumes_a_checkpoint_with_commits_or_a_seed(tmp_path):
    from argparse import Namespace

    from spark_runtime.stage import resumes_checkpoint

    fresh = Namespace(seed_from=None, checkpoint_dir=str(tmp_path / "cp"), job="j", stage="s",
                      replica_id="r")  # fmt: skip
    assert not resumes_checkpoint(fresh)
    (tmp_path / "cp" / "q0" / "commits").mkdir(parents=True)
    assert not resumes_checkpoint(fresh)  # a query that never committed a batch
    (tmp_path / "cp" / "q0" / "commits" / "0").write_text("v1")
    assert resumes_checkpoint(fresh)
    assert resumes_checkpoint(Namespace(**{**vars(fresh), "checkpoint_dir": str(tmp_path / "x"),
                                           "seed_from": "/elsewhere"}))  # fmt: skip


def test_only_a_standby_below_its_primary_is_paced():
    from spark_runtime.stage import batch_every_s
    from spark_runtime.strategies import (
        CATCHING_UP_NICE,
        SPARE_NICE,
        STANDBY_BATCH_EVERY_S,
        STANDBY_NICE,
    )

    assert batch_every_s(STANDBY_NICE) == STANDBY_BATCH_EVERY_S == 6.0
    assert batch_every_s(0) is None  # a primary, or a standby that is starting
    assert batch_every_s(CATCHING_UP_NICE) is None
    assert batch_every_s(SPARE_NICE) is None
    # The old version of an upgrade, standing by at low priority for a rollback: every batch.
    assert batch_every_s(STANDBY_NICE, full_pace=True) is None


def test_a_process_goes_up_only_as_far_as_it_may():
    allowed = cpu_priority.allowed_nice
    # With CAP_SYS_NICE (lowest -20): a promoted standby goes from 5 to a primary's -5.
    assert allowed(-5, current=5, lowest=-20) == -5
    # With RLIMIT_NICE 20 (lowest 0): to 0, not left at 5 below the standby catching up at 0.
    assert allowed(-5, current=5, lowest=0) == 0
    assert allowed(-5, current=0, lowest=0) == 0
    # Going down in priority is always allowed; with no RLIMIT_NICE, going up never is.
    assert allowed(19, current=0, lowest=20) == 19
    assert allowed(0, current=19, lowest=20) == 19
