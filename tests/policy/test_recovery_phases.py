"""The phases of a recovery from the marks its steps took (console/policy/recovery_phases.py)."""

import pytest

from console.policy import recovery_phases as rp


def test_a_restart_has_every_phase_in_order():
    marks = {"fault": 100.0, "detected": 101.0, "decided": 101.25, "commanded": 101.5,
             "process_started": 103.0, "state_restored": 110.0, "caught_up": 112.5,
             "first_output": 113.0}  # fmt: skip
    seconds = rp.phase_seconds(marks)
    assert list(seconds) == [name for name, _ in rp.PHASES]
    assert seconds == {"detection": 1.0, "decision": 0.25, "command": 0.25, "process start": 1.5,
                       "state restore": 7.0, "catch-up": 2.5, "first output": 0.5}  # fmt: skip
    assert sum(seconds.values()) == pytest.approx(marks["first_output"] - marks["fault"])


def test_a_promotion_skips_start_and_restore_and_counts_from_the_command():
    marks = {"fault": 0.0, "detected": 1.0, "decided": 1.1, "commanded": 1.2, "caught_up": 1.7,
             "first_output": 2.0}  # fmt: skip
    seconds = rp.phase_seconds(marks)
    assert seconds["process start"] is None and seconds["state restore"] is None
    assert seconds["catch-up"] == pytest.approx(0.5)
    assert seconds["first output"] == pytest.approx(0.3)


def test_a_mark_before_the_previous_one_counts_zero_not_negative():
    seconds = rp.phase_seconds({"fault": 10.0, "detected": 9.9, "decided": 10.5})
    assert seconds["detection"] == 0.0
    assert seconds["decision"] == pytest.approx(0.5)
    assert seconds["first output"] is None


def test_stage_marks_ignore_an_older_run_of_the_replica():
    entry = {"started_at": 50.0, "queries_started_at": 105.0, "first_batch_at": 107.0,
             "promoted_at": 106.0}  # fmt: skip
    assert rp.stage_marks(entry, promoted=False, since=100.0) == {
        "state_restored": 105.0,
        "caught_up": 107.0,
    }
    assert rp.stage_marks(entry, promoted=True, since=100.0) == {"caught_up": 106.0}


def test_first_output_after_the_last_mark():
    marks = {"fault": 0.0, "detected": 1.0, "commanded": 1.5, "caught_up": 4.0}
    assert rp.last_mark(marks) == 4.0
    assert rp.first_output_after([0.5, 3.9, 4.2, 5.0], rp.last_mark(marks)) == 4.2
    assert rp.first_output_after([0.5], 4.0) is None
