"""`manage.py bench_upgrade`: its options and table (fast), and end to end on a built-in
topology (slow: real Redis, controller, node agents and Spark jobs, about 15 minutes on 2 cores;
run with `pytest -m slow tests/bench/test_bench_upgrade.py`)."""

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command

from bench.upgrade.run import (
    first_output_after,
    longest_gap,
    reference_params,
    rollback_moment,
    to_markdown,
)
from tests.bench.command import run_bench_command


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--topology", "nosuch@1", "--to", "nosuch@2"], "not a built-in topology"),
        (["--topology", "topn", "--to", "wordcount"], "a version of the same topology"),
        (["--topology", "topn", "--to", "topn", "--param", "n=3"], "not OP.KEY=VALUE"),
    ],
)
def test_bad_options_are_refused_naming_the_option(options, message):
    with pytest.raises(CommandError, match=message):
        call_command("bench_upgrade", *options)


def test_the_table_sets_blue_green_against_stop_and_restart():
    row = {"case": "seeded", "status": "confirmed", "lost": 0, "duplicates": 0, "result_cells": 9}
    result = {
        "blue_green": {**row, "gap_s": 0.8, "longest_gap_before_switch_s": 0.61},
        "stop_restart": {**row, "gap_s": 8.0, "longest_gap_before_switch_s": None},
    }
    table = to_markdown(result)
    assert "| blue_green | seeded | confirmed | 0.80 | 0.61 | - | 0 | 0 | 9 |" in table
    assert "| stop_restart | seeded | confirmed | 8.00 | - | - | 0 | 0 | 9 |" in table
    assert "10% of stop-and-restart's" in table


def test_the_table_gives_a_rollbacks_gap_and_how_it_was_rolled_back():
    row = {"case": "seeded", "lost": 0, "duplicates": 0, "result_cells": 9, "gap_s": 0.8}
    result = {
        "blue_green": {**row, "status": "rolled_back", "rollback": "crash", "rollback_gap_s": 1.2},
        "stop_restart": {**row, "status": "confirmed", "gap_s": 8.0},
    }
    assert "| blue_green | seeded | rolled_back | 0.80 | - | 1.20 (crash) | 0 | 0 | 9 |" in (
        to_markdown(result)
    )


def test_a_latency_rollbacks_gap_is_measured_at_the_controllers_decision():
    """A kill or an operator's request moves the output back at once; a slowed new version
    writes, late, until the controller rolls it back, so its gap is measured there."""
    ended = datetime.fromtimestamp(130.0, tz=UTC)
    rolled_back = SimpleNamespace(status="rolled_back", ended_at=ended)
    assert rollback_moment(rolled_back, "crash", 100.0) == 100.0
    assert rollback_moment(rolled_back, "by-hand", 100.0) == 100.0
    assert rollback_moment(rolled_back, "latency", 100.0) == 130.0
    confirmed = SimpleNamespace(status="confirmed", ended_at=ended)
    assert rollback_moment(confirmed, "latency", 100.0) is None  # the rollback never came
    assert rollback_moment(rolled_back, "latency", None) is None  # nothing was caused


def test_the_longest_gap_before_the_switch_counts_from_the_request_to_the_switch():
    out = [SimpleNamespace(at=t, is_output=True) for t in (9.0, 10.5, 11.0, 13.0, 13.4, 20.0)]
    idle = SimpleNamespace(at=12.0, is_output=False)
    # Output at 10.5, 11.0, 13.0 and 13.4 within [10, 14): the gaps 0.5, 0.5, 2.0, 0.4, 0.6.
    assert longest_gap([*out, idle], 10.0, 14.0) == 2.0
    assert longest_gap(out, 10.0, None) is None
    assert longest_gap([], 10.0, 12.5) == 2.5


def test_the_first_output_after_a_rollback_counts_from_the_rollback():
    out = [SimpleNamespace(at=t, is_output=True) for t in (9.0, 12.0, 12.3)]
    idle = SimpleNamespace(at=11.0, is_output=False)
    assert first_output_after([*out, idle], 10.5) == 1.5
    assert first_output_after(out, 13.0) is None
    assert first_output_after(out, None) is None


@pytest.mark.django_db
def test_a_built_in_topologys_reference_takes_its_params_and_the_upgrades():
    """topn's reference needs its window and n (the run crashed with KeyError without them)."""
    assert reference_params("topn", {"topn.watermark_seconds": "31"}) == {
        "window_seconds": 10, "n": 5, "watermark_seconds": "31",
    }  # fmt: skip
    assert reference_params("topn", {"topn.n": "3"})["n"] == "3"


@pytest.mark.slow
@pytest.mark.spark
def test_a_built_in_job_upgraded_with_a_result_preserving_parameter(tmp_path):
    # topn with a later watermark: the same state schema and, with in-order input, the same
    # results, so both upgrades are audited against topn's own reference. The input lasts long
    # enough that the switch (after a state check of up to 2 minutes and the catch-up) comes
    # while it flows: a new version that ran no batch since the switch is not confirmed.
    # Declared result-preserving: the old version checks the new one's top-N per window.
    upgrade = run_bench_command(
        tmp_path,
        "--topology", "topn", "--to", "topn", "--param", "topn.watermark_seconds=31",
        "--rate", "50", "--warmup", "30", "--duration", "300", "--result-preserving",
        timeout_s=2400, command="bench_upgrade", result="upgrade.json",
    )  # fmt: skip
    assert upgrade["settings"]["to_params"] == {"topn.watermark_seconds": "31"}
    assert upgrade["settings"]["result_preserving"]
    for mode in ("blue_green", "stop_restart"):
        run = upgrade[mode]
        assert run["case"] == "seeded", run
        assert run["status"] == "confirmed" and not run["rolled_back"], run
        assert (run["lost"], run["duplicates"]) == (0, 0), run
        assert run["result_cells"] > 0
        assert run["gap_s"] is not None, run  # the output came back after the switch
    assert upgrade["blue_green"]["gap_s"] < upgrade["stop_restart"]["gap_s"]
    assert "its results equal to the old version's on the" in upgrade["blue_green"]["outcome"]
