"""The cold baseline's loop (bench/app_restart/cold.py) with the installed PySpark's real
`spark-submit`: a killed app is started again, and a stopped loop starts nothing more."""

from __future__ import annotations

import time

import pytest

from bench.app_restart.cold import SparkSubmitLoop
from infra.launcher import wait_for

# Two JVM starts of `spark-submit`: 62 s measured with the machine's load average near 14.
pytestmark = pytest.mark.slow

# An app without a session: what the loop does is the same, and no JVM session start is paid.
APP = """\
import os
import sys
import time

with open(sys.argv[1], "a") as starts:
    starts.write(f"{os.getpid()}\\n")
time.sleep(600)
"""


def test_the_loop_starts_a_killed_app_again_until_stopped(tmp_path):
    app, starts = tmp_path / "app.py", tmp_path / "starts.txt"
    app.write_text(APP)
    loop = SparkSubmitLoop(app, [str(starts)], tmp_path / "spark-submit.log")
    assert loop.command[0].endswith("/spark-submit") and "--master" in loop.command
    loop.start()
    try:
        wait_for(lambda: starts.exists() and starts.read_text().strip(), 120, "the first start")
        killed_at = loop.kill()
        wait_for(lambda: len(starts.read_text().split()) == 2, 120, "the start after the kill")
        first, second = starts.read_text().split()
        assert first != second  # a new process: the app's Python under a new spark-submit
        assert len(loop.starts) == 2 and loop.starts[1] >= killed_at
    finally:
        loop.stop()
    assert loop.pid() is None and not loop.thread.is_alive()
    time.sleep(1)
    assert len(starts.read_text().split()) == 2  # nothing restarted after the stop
