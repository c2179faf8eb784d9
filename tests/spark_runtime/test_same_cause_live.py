"""The issue's case on real Spark, through the local runner (`python -m spark_runtime run`): a
stage whose Python workers cannot import pyarrow. Spark only says that the worker did not connect
back within 10 s; the stage asks the workers' interpreter why, exits at once with that cause,
and the supervisor gives up after `same_cause_failures_limit` (3) starts that failed the same
way, saying so, instead of restarting the stage for ever.

The interpreter is this one, run by a wrapper (PYSPARK_PYTHON) that puts a `pyarrow` package
raising ModuleNotFoundError first on the workers' path; the stage's driver keeps the real one.
About 20 s per start (a session, then Spark's 10 s wait for the worker): a minute in all.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime

import pytest

from spark_runtime import keys
from spark_runtime.config import worker_python

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PYARROW = "ModuleNotFoundError: No module named 'pyarrow'"
VERDICT = (
    f"count: primary failed 3 times in a row with the same cause: {PYARROW}; not restarting "
    "(policy same_cause_failures_limit=3)"
)
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def without_pyarrow(folder) -> str:
    """A worker interpreter (a wrapper script) for which `import pyarrow` fails."""
    fake = folder / "fake" / "pyarrow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyarrow'\", name='pyarrow')\n"
    )
    wrapper = folder / "python-without-pyarrow"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'export PYTHONPATH="{folder / "fake"}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'exec "{worker_python()}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def logged_at(line: str) -> float:
    return datetime.strptime(LOG_TIME.match(line).group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_stage_whose_workers_cannot_import_pyarrow_is_failed_for_good_saying_so(
    redis_conn, redis_url, job, tmp_path
):
    env = {**os.environ, "PYSPARK_PYTHON": without_pyarrow(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "spark_runtime", "run", "--topology", "wordcount", "--job", job,
         "--redis-url", redis_url],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-5000:]
    assert f"{job} failed for good: {VERDICT}" in done.stderr

    lines = output.splitlines()
    starts = [line for line in lines if "spark_runtime.runner: started count-1" in line]
    events = [line for line in lines if "spark_runtime.runner: event " in line]
    gave_up = next(line for line in lines if "gave up on the job" in line)
    seconds = logged_at(gave_up) - logged_at(starts[0])
    print(f"{len(starts)} starts, failed for good {seconds:.1f} s after the first start")
    assert len(starts) == 3
    # Each failure reached the supervisor with the cause the stage reported before it exited.
    assert len(events) == 3
    assert all(f'cause="{PYARROW}"' in line for line in events), events
    assert seconds < 180
    # The replica's own entry says why; the stage's log has the worker's traceback.
    entry = json.loads(redis_conn.hget(keys.replicas(job), "count-1"))
    assert entry["error"] == PYARROW
    stage_log = (tmp_path / "var" / "logs" / job / "count-1.log").read_text()
    assert stage_log.count("the Python workers' interpreter cannot start:") == 3
