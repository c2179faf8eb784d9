"""The class-data archive's build lock (spark_runtime/class_sharing.py, issue 58): never held by
two builders at once, however many try together or however long a build takes, and free again
when its builder dies. Real lock files and real processes; no Spark (the builder is replaced by
a sleeping process that inherits what the real one would)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from spark_runtime import class_sharing
from spark_runtime.class_sharing import ARCHIVE_ENV, ensure_archive, lock_path, take_build_lock
from tests.proc_environ import environ_of

HOLDER = """
import sys, time
from pathlib import Path
from spark_runtime.class_sharing import take_build_lock
fd = take_build_lock(Path(sys.argv[1]))
print("held" if fd is not None else "refused", flush=True)
time.sleep(30)
"""


@pytest.fixture(autouse=True)
def _clear_cache():
    """Replaces the suite's autouse fixture that empties the Redis cache: nothing here needs
    Redis or a database."""


def test_threads_trying_at_once_never_hold_it_together(tmp_path):
    archive = tmp_path / "spark.jsa"
    holders, most, taken = [0], [0], [0]
    count_lock = threading.Lock()
    start = threading.Barrier(8)

    def builder():
        start.wait()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            fd = take_build_lock(archive)
            if fd is None:
                continue
            with count_lock:
                holders[0] += 1
                taken[0] += 1
                most[0] = max(most[0], holders[0])
            time.sleep(0.005)
            with count_lock:
                holders[0] -= 1
            os.close(fd)

    threads = [threading.Thread(target=builder) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1
    assert taken[0] > 8  # it did change hands


def test_another_process_holds_it_until_it_dies(tmp_path):
    archive = tmp_path / "spark.jsa"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(archive)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert take_build_lock(archive) is None
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own
        holder.wait()
    fd = take_build_lock(archive)
    assert fd is not None
    os.close(fd)


@pytest.fixture
def sleeping_builder(monkeypatch, tmp_path):
    """ensure_archive with the archive under tmp_path, the console's SECRET_KEY in this
    process's environment, and a sleeping process instead of the Spark build (started with the
    arguments ensure_archive gives: what it inherits)."""
    monkeypatch.setenv(ARCHIVE_ENV, str(tmp_path / "cds" / "spark.jsa"))
    monkeypatch.setenv("SECRET_KEY", "console-signing-key")
    started = []
    real_popen = subprocess.Popen

    def sleeper(args, **kwargs):
        proc = real_popen([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(class_sharing.subprocess, "Popen", sleeper)
    yield started
    monkeypatch.undo()
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_build_longer_than_the_timeout_keeps_its_lock(sleeping_builder, tmp_path):
    """Before: a lock file older than BUILD_TIMEOUT_S was taken for a dead builder's, removed and
    taken again, so a slow build got a second builder beside it."""
    log = tmp_path / "build.log"
    first = ensure_archive("redis://127.0.0.1:1/0", log)
    assert first is not None
    archive = class_sharing.archive_path()
    long_ago = time.time() - 10 * class_sharing.BUILD_TIMEOUT_S
    os.utime(lock_path(archive), (long_ago, long_ago))  # the build has run for a long time
    assert ensure_archive("redis://127.0.0.1:1/0", log) is None
    assert len(sleeping_builder) == 1
    # The builder runs Spark like a stage: none of the console's secrets.
    environment = environ_of(first.pid)
    assert environment and "SECRET_KEY" not in environment
    os.killpg(first.pid, signal.SIGKILL)  # the builder dies
    first.wait()
    second = ensure_archive("redis://127.0.0.1:1/0", log)
    assert second is not None and len(sleeping_builder) == 2


def test_agents_starting_together_start_one_builder(sleeping_builder, tmp_path):
    start = threading.Barrier(6)
    answers = []

    def agent_start():
        start.wait()
        answers.append(ensure_archive("redis://127.0.0.1:1/0", tmp_path / "build.log"))

    threads = [threading.Thread(target=agent_start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len([a for a in answers if a is not None]) == 1
    assert len(sleeping_builder) == 1
