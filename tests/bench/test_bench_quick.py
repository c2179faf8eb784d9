"""`manage.py bench --quick` end to end: real Redis, controller, node agents and Spark jobs.

Slow (about 7 minutes on 2 cores): run with `pytest -m slow tests/bench`. It runs in its own
process on a fresh SQLite database and Redis db 13, like a user running the command.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

pytestmark = [pytest.mark.slow, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/13"


def test_quick_bench_writes_exact_results_and_adaptive_recovers_faster(tmp_path):
    redis.Redis.from_url(REDIS_URL).flushdb()
    out = tmp_path / "out"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "web.settings.local",
        "BACKSTOP_VAR_DIR": str(tmp_path / "var"),
        "REDIS_URL": REDIS_URL,
    }
    env.pop("DATABASE_URL", None)  # the command's own SQLite file, as a user's first run
    done = subprocess.run(
        [sys.executable, "manage.py", "bench", "--quick", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    bench = json.loads((out / "bench.json").read_text())
    runs = {run["strategy"]: run for run in bench["runs"]}
    assert set(runs) == {"restart-all", "adaptive"}
    for run in runs.values():
        # Checked against the ground truth computed from the whole input stream.
        assert run["input_events"] == bench["settings"]["rate"] * 140
        assert (run["lost"], run["duplicates"]) == (0, 0)
        assert len(run["faults"]) == 1
        assert run["faults"][0]["recovery_time_s"] is not None, run["faults"][0]
    assert runs["adaptive"]["faults"][0]["action"] == "promote"
    assert runs["restart-all"]["faults"][0]["action"] == "restart-job"
    assert (
        runs["adaptive"]["faults"][0]["recovery_time_s"]
        < runs["restart-all"]["faults"][0]["recovery_time_s"]
    )
    assert "| adaptive |" in (out / "bench.md").read_text()
    assert (out / "bench.png").stat().st_size > 10_000
