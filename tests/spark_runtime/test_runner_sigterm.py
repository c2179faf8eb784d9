"""The local runner (`python -m spark_runtime run`) stopped with SIGTERM, as a process manager
stops it, stops its job's processes too: none is left running without a supervisor."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

pytestmark = [pytest.mark.spark]

STARTED = re.compile(r"started (\S+) \(.*\) pid (\d+)")


def test_a_runner_stopped_with_sigterm_stops_its_stages(redis_url, job, tmp_path):
    log_path = tmp_path / "runner.log"
    with open(log_path, "w") as log:
        runner = subprocess.Popen(
            [sys.executable, "-m", "spark_runtime", "run", "--topology", "wordcount", "--job",
             job, "--redis-url", redis_url],
            cwd=tmp_path, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        started = []
        while not started and time.monotonic() < deadline:
            time.sleep(0.2)
            started = STARTED.findall(log_path.read_text())
        assert started, log_path.read_text()[-3000:]
        stage_pids = [int(pid) for _, pid in started]
        assert all(psutil.pid_exists(pid) for pid in stage_pids)

        runner.send_signal(signal.SIGTERM)
        runner.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(pid) for pid in stage_pids):
            time.sleep(0.1)
        assert not [pid for pid in stage_pids if alive(pid)], "a stage outlived its runner"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
