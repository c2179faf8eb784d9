"""`manage.py bench_upgrade`: its options and table (fast), and end to end on a built-in
topology (slow: real Redis, controller, node agents and Spark jobs, about 15 minutes on 2 cores;
run with `pytest -m slow tests/bench/test_bench_upgrade.py`)."""

import pytest
from django.core.management import CommandError, call_command

from bench.upgrade.run import reference_params, to_markdown
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
    result = {"blue_green": {**row, "gap_s": 0.8}, "stop_restart": {**row, "gap_s": 8.0}}
    table = to_markdown(result)
    assert "| blue_green | seeded | confirmed | 0.80 | 0 | 0 | 9 |" in table
    assert "| stop_restart | seeded | confirmed | 8.00 | 0 | 0 | 9 |" in table
    assert "10% of stop-and-restart's" in table


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
