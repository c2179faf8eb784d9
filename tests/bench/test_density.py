"""`manage.py density` end to end, tiny: one job, one kill-driver fault, a 60 s steady window,
on the command's own Redis, database, controller, beat, agents and Spark job.

Slow (the same command took 4 minutes at a load average of 30, and 21 minutes at 60 when this
test failed on a 20 s window without a final batch): `pytest -m slow tests/bench/test_density.py`.
It runs the command in its own process, as a user would, with a fresh SQLite file as its default
database (the run itself uses its own PostgreSQL when the machine has one).
"""

import json
import os
import subprocess
import sys

import psutil
import pytest

from tests.bench.command import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.spark]

SPREAD_KEYS = {"p50", "p99", "count"}


def test_one_job_one_fault_writes_real_figures(tmp_path):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "web.settings.local",
        "BACKSTOP_VAR_DIR": str(tmp_path / "var"),
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "density", "--jobs", "1", "--faults", "1", "--rate", "20",
         "--steady", "60", "--reprotect-timeout", "120", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "steady window" in done.stdout  # progress is printed
    report = json.loads((out / "density.json").read_text())
    assert report["complete"]
    (run,) = report["runs"]
    assert {"jobs", "cpu_cores", "steady_p50_ms", "recovery_s", "reprotect_s", "lost",
            "duplicates", "standbys_kept", "standbys_wanted"} <= set(run)  # fmt: skip
    assert run["jobs"] == 1
    # A Spark job at 20 lines/s uses CPU, but not more than the machine has.
    assert 0.05 < run["cpu_cores"] <= psutil.cpu_count()
    # Where it went: the kinds add up to the whole, and the job's primary used some of it.
    by_kind = run["cpu_by_kind"]
    assert sum(by_kind.values()) == pytest.approx(run["cpu_cores"], abs=0.02)
    assert by_kind["primary"] > 0 and "controller" in by_kind
    assert run["steady_p50_ms"] > 0
    assert SPREAD_KEYS == set(run["recovery_s"]) == set(run["reprotect_s"])
    # The fault was injected and its recovery measured by the console's episode.
    (fault,) = run["faults"]
    assert fault["outcome"] == "injected", fault
    assert run["recovery_s"]["count"] >= 1 and run["recovery_s"]["p50"] > 0
    (first, *_) = fault["episodes"]
    assert first["phases_s"]["detection"] is not None
    assert first["phases_s"]["first output"] is not None
    # Checked against the plain-Python reference of the input.
    assert (run["lost"], run["duplicates"]) == (0, 0)
    assert 0 <= run["standbys_kept"] <= run["standbys_wanted"] and run["standbys_wanted"] >= 1
