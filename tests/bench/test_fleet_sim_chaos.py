"""The chaos run of the control plane (issue 58, bench/fleet/chaos.py) at a small size: the real
controllers, paused at random and killed in the middle of upgrades, while operators stop jobs
and roll back or confirm the upgrades. Slow: a few minutes, with a SparkSession per upgrade (the
real state check).

What it asserts is measured apart from the controllers: every controller command the simulated
agents and stages carried out is checked against the job's lease read at that moment (not the
fence's verdict); a replica id started while running on another node is seen by the simulated
agents; each request's effect and each upgrade's end are read from the database and the
simulated nodes at the end.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

PAUSES, UPGRADES = 4, 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_chaos_run_carries_out_no_stale_command_and_loses_no_request(tmp_path):
    call_command(
        "fleet_sim", "--jobs", "24", "--nodes", "6", "--controllers", "3",
        "--pause-controllers", str(PAUSES), "--kill-during-upgrade", str(UPGRADES),
        "--duration", "90", "--page-requests", "2", "--out", str(tmp_path),
    )  # fmt: skip
    result = json.loads((tmp_path / "fleet.json").read_text())
    fence = result["sim"]["fence"]
    upgrades, requests = result["upgrades"], result["operator_requests"]
    # The goals.
    assert result["stale_commands_executed"] == 0, fence["stale_examples"]
    assert result["duplicate_replica_starts"] == 0, fence["duplicate_examples"]
    assert requests["lost"] == 0, requests["lost_examples"]
    assert upgrades["unfinished"] == 0, upgrades["log"]
    assert upgrades["replaced_still_running"] == 0, upgrades["log"]
    # The chaos happened as asked.
    assert result["faults"]["controller_pauses"] == PAUSES, result["fault_log"]
    assert upgrades["started"] == UPGRADES, upgrades["log"]
    assert upgrades["killed_in_the_middle"] == UPGRADES, upgrades["log"]
    assert requests["sent"] >= 1 + UPGRADES, requests  # a stop, and a request per upgrade
    assert fence["fenced_commands_carried_out"] > 0
    assert result["controller_takeover_s"] is not None and result["controller_takeover_s"] <= 5
    f2a = result["failure_to_action_ms_supervised"]
    assert f2a["count"] > 0 and f2a["p99"] <= 1000, f2a
