"""kill_job_processes, what the demo and the benchmarks call to leave nothing behind: a stage
that leads its own process group is killed with the whole group (its JVM and the JVM's Python
workers), against real processes; another job's stage is left alone."""

from __future__ import annotations

import subprocess
import sys
import uuid

import psutil

from console.services.jobs import kill_job_processes
from infra.processes import STAGE_MODULE, argv_of
from tests.conftest import wait_until

# A stage whose driver starts a child that does not look like a stage (as the JVM and its
# Python workers do not).
STAGE_WITH_CHILD = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "time.sleep(60)"
)


def start_stage(job_key: str) -> subprocess.Popen:
    """A stage-like process of `job_key` in a session of its own, as launch.py starts one."""
    args = ["-m", STAGE_MODULE, "--job", job_key]
    proc = subprocess.Popen([sys.executable, "-c", STAGE_WITH_CHILD, *args], start_new_session=True)
    wait_until(
        lambda: argv_of(psutil.Process(proc.pid).cmdline())[-len(args) :] == args,
        10,
        f"pid {proc.pid} to show {args}",
    )
    return proc


def test_a_stage_is_killed_with_its_group_and_another_jobs_stage_is_not():
    tag = uuid.uuid4().hex[:8]
    mine, theirs = start_stage(f"mine-{tag}"), start_stage(f"theirs-{tag}")
    try:
        child = wait_until(lambda: psutil.Process(mine.pid).children(), 10, "the child")[0]
        assert kill_job_processes({f"mine-{tag}"}) == 1
        assert mine.wait(timeout=10) == -9
        wait_until(lambda: not child.is_running() or child.status() == "zombie", 10, "child gone")
        assert theirs.poll() is None
    finally:
        for proc in (mine, theirs):
            proc.kill()
            proc.wait()
