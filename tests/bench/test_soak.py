"""`manage.py soak` end to end, shortened: six minutes, an event every 40-60 s (seed 7: kill-node,
controller restart, kill-driver, agent restart, stress-node, Redis restart, PostgreSQL restart),
on the command's own Redis, PostgreSQL (where installed), controller, beat, agents and Spark jobs.

Slow (about 15-20 minutes on 2 cores): run with `pytest -m slow tests/bench/test_soak.py`. It
runs the command in its own process, as a user would, with a fresh SQLite file as its default
database (the run itself uses its own PostgreSQL when the machine has one).
"""

import json
import os
import subprocess
import sys

import pytest

from bench.soak.report import REPORT_KEYS
from bench.soak.schedule import plan_schedule
from tests.bench.command import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.spark]

MINUTES, SPACING, SEED = 6, (40, 60), 7


def test_short_soak_measures_every_event_and_audits_exact_outputs(tmp_path):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "web.settings.local",
        "BACKSTOP_VAR_DIR": str(tmp_path / "var"),
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "soak", "--minutes", str(MINUTES),
         "--spacing", ",".join(map(str, SPACING)), "--audit-every", "120",
         "--seed", str(SEED), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((out / "soak.json").read_text())
    assert report["complete"]
    assert set(REPORT_KEYS) <= set(report)

    # Every scheduled event happened, in order, with its recovery judged.
    planned = plan_schedule(SEED, MINUTES * 60, SPACING)
    assert [(f["number"], f["kind"]) for f in report["faults"]] == [
        (e.number, e.kind) for e in planned
    ]
    for fault in report["faults"]:
        assert {"kind", "target", "at_s", "recovered", "recovery_s"} <= set(fault), fault
        assert fault["at_s"] >= fault["scheduled_at_s"]
        if fault["injected"]:
            assert fault["recovered"] in (True, False), fault
            assert (fault["recovery_s"] is not None) == fault["recovered"], fault
    injected = {f["kind"] for f in report["faults"] if f["injected"]}
    assert {"kill-node", "controller-restart", "kill-driver", "agent-restart"} <= injected

    # The audits compare each job's output so far with the plain-Python reference of its input
    # (at 120 s, 240 s and at the end): nothing lost, nothing duplicated.
    jobs = {job["name"] for job in report["jobs"]}
    assert len(jobs) == 3
    for job in jobs:
        audits = [a for a in report["audits"] if a["job"] == job]
        assert len(audits) >= 3, audits
        assert all((a["lost"], a["duplicates"]) == (0, 0) for a in audits), audits
    assert any(a["cells"] for a in report["audits"])

    assert isinstance(report["leaked_processes"], list)
    assert isinstance(report["leaked_keys"], list)
    assert report["rss_mb"]["at_10_min"] and report["rss_mb"]["at_end"]
    assert "first fifth" in report["rss_mb"]["reference"]
    assert report["samples"][-1]["at_s"] >= MINUTES * 60
    assert set(report["goals"]) == {
        "every_fault_recovered", "fast_recoveries", "reprotected", "exact_output", "no_leaks",
        "rss_stable", "growth_bounded",
    }  # fmt: skip
    # A fault that opened episodes names their actions; a promotion's re-protect was waited for
    # (seconds, or None: not protected again within the goal's time after the last fault).
    with_episodes = [f for f in report["faults"] if f.get("phases_s")]
    assert with_episodes and all(f["actions"] for f in with_episodes)
    for fault in with_episodes:
        assert ("reprotect_s" in fault) == ("promote" in fault["actions"]), fault
