"""The one launcher of stage processes (spark_runtime/launch.py), with a real child: its output
appended to the log, a session of its own, the stage environment, and the nice level set in the
child. What the child reports of itself is checked against what this process reads of it from
outside (os.getsid, os.getpriority, /proc)."""

from __future__ import annotations

import json
import os
import sys

from spark_runtime.launch import start_stage_process
from spark_runtime.replicas import ReplicaSpec
from spark_runtime.runner import SubprocessLauncher
from tests.conftest import wait_until
from tests.proc_environ import environ_of

CHILD = "tests.spark_runtime.launched_child"
NAMES = ["SECRET_KEY", "SPARK_LOG_LEVEL", "REDIS_URL", "PYSPARK_PYTHON"]


def reported(log_path) -> dict | None:
    """The child's JSON line in its log, once it has written it."""
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    found = [json.loads(line) for line in lines if line.startswith("{")]
    return found[-1] if found else None


def test_a_child_runs_in_its_own_session_with_the_stage_environment(started, tmp_path, monkeypatch):
    monkeypatch.setenv("SECRET_KEY", "console-signing-key")
    monkeypatch.setenv("SPARK_LOG_LEVEL", "WARN")
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python-of-the-workers")
    log_path = tmp_path / "logs" / "job" / "count-1.log"  # its directory does not exist yet
    proc = start_stage_process(CHILD, NAMES, log_path, env_overrides={"REDIS_URL": "redis://r:1/2"})
    started.append(proc)
    seen = wait_until(lambda: reported(log_path), 20, "the child's line in its log")
    wait_until(lambda: "to stderr" in log_path.read_text(), 10, "stderr in the same log")
    assert seen["pid"] == proc.pid
    # A session of its own, led by the child: not this process's.
    assert os.getsid(proc.pid) == proc.pid == seen["sid"]
    assert os.getsid(proc.pid) != os.getsid(0)
    assert os.getpgid(proc.pid) == proc.pid
    # The allow-listed variables and the override; never the console's secret.
    assert seen["env"] == {
        "SECRET_KEY": None,
        "SPARK_LOG_LEVEL": "WARN",
        "REDIS_URL": "redis://r:1/2",
        "PYSPARK_PYTHON": "/opt/python-of-the-workers",
    }
    # Without a nice level it runs at this process's.
    assert os.getpriority(os.PRIO_PROCESS, proc.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    assert os.readlink(f"/proc/{proc.pid}/exe") == os.path.realpath(sys.executable)


def test_the_log_is_appended_to_and_the_nice_level_set_in_the_child(started, tmp_path):
    log_path = tmp_path / "standby.log"
    log_path.write_text("an earlier run's last line\n")
    # A lower priority than this process's (a process may always lower its own).
    level = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)
    proc = start_stage_process(CHILD, [], log_path, nice=level)
    started.append(proc)
    seen = wait_until(lambda: reported(log_path), 20, "the child's line in its log")
    assert log_path.read_text().splitlines()[0] == "an earlier run's last line"
    assert seen["nice"] == level == os.getpriority(os.PRIO_PROCESS, proc.pid)
    assert os.getsid(proc.pid) == proc.pid


def test_without_a_log_the_output_is_discarded_and_fds_are_passed(started, tmp_path):
    held = os.open(tmp_path / "lock", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    try:
        proc = start_stage_process(CHILD, [], None, pass_fds=(held,))
        started.append(proc)
    finally:
        os.close(held)
    # The child has the descriptor (same number, same file) though this process closed its own.
    fd_path = f"/proc/{proc.pid}/fd/{held}"
    wait_until(lambda: os.path.exists(fd_path), 10, "the passed descriptor in the child")
    assert os.readlink(fd_path) == str(tmp_path / "lock")
    assert os.readlink(f"/proc/{proc.pid}/fd/1") == os.readlink(f"/proc/{proc.pid}/fd/2")
    assert os.readlink(f"/proc/{proc.pid}/fd/1") == os.devnull
    assert list(tmp_path.iterdir()) == [tmp_path / "lock"]  # no log written anywhere here


def test_the_local_runner_starts_a_standby_below_its_primary(tmp_path, monkeypatch):
    """The local runner's replicas through the launcher: a standby at `standby_nice`, a primary
    at this process's level, each leading its session, logged under log_dir, with the data
    plane's Redis and the operator's PYSPARK_PYTHON. Killed before their Spark session starts."""
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python-of-the-workers")
    monkeypatch.setenv("SECRET_KEY", "console-signing-key")
    level = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 4)
    launcher = SubprocessLauncher(
        "redis://127.0.0.1:1/3", str(tmp_path / "ck"), str(tmp_path / "logs"), standby_nice=level
    )
    replicas = {
        role: ReplicaSpec("j-launch", "wordcount", "count", role, f"count-{n}", "node-1")
        for n, role in enumerate(("primary", "standby"), start=1)
    }
    try:
        for replica in replicas.values():
            launcher.start(replica)
        # The nice level is set in the child before it runs the stage's first line.
        expected = {"primary": os.getpriority(os.PRIO_PROCESS, 0), "standby": level}
        for role, replica in replicas.items():
            pid = launcher.pid(replica.replica_id)
            assert os.getpriority(os.PRIO_PROCESS, pid) == expected[role], role
            assert os.getsid(pid) == pid != os.getsid(0)
            assert (tmp_path / "logs" / f"{replica.replica_id}.log").is_file()
            seen = environ_of(pid)
            assert seen["REDIS_URL"] == "redis://127.0.0.1:1/3"
            assert seen["PYSPARK_PYTHON"] == "/opt/python-of-the-workers"
            assert "SECRET_KEY" not in seen
    finally:
        launcher.kill_all()
    assert not any(launcher.alive(r.replica_id) for r in replicas.values())
