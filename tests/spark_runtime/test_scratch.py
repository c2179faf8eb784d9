"""Scratch directories of started processes (spark_runtime/scratch.py, launch.py): each child
gets its own as TMPDIR and SPARK_LOCAL_DIRS and holds its lock for its life; a directory whose
process is gone, however it ended, is removed at the next start. Real children, real locks;
what a real Spark driver puts there is checked in tests/integration/test_supervision_live.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

from spark_runtime.config import session_conf, tmpdir_option
from spark_runtime.launch import scratch_root, start_stage_process
from spark_runtime.scratch import CREATING_GRACE_S, LOCK_NAME, claim, sweep
from tests.conftest import wait_until
from tests.proc_environ import environ_of

CHILD = "tests.spark_runtime.launched_child"


@pytest.fixture
def var_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BACKSTOP_VAR_DIR", str(tmp_path))
    return tmp_path


def test_a_held_directory_stays_and_a_released_one_goes(tmp_path):
    held, held_fd = claim(tmp_path)
    released, released_fd = claim(tmp_path)
    (released / "blockmgr-1").mkdir()
    (released / "blockmgr-1" / "shuffle_0_0_0.data").write_bytes(b"x" * 1000)
    os.close(released_fd)
    try:
        assert sweep(tmp_path) == [released]
        assert held.is_dir() and not released.exists()
        assert sweep(tmp_path) == []  # nothing left to do: sweeping twice is harmless
    finally:
        os.close(held_fd)
    assert sweep(tmp_path) == [held]
    assert sweep(tmp_path / "never-created") == []


def test_a_directory_being_made_or_without_its_lock_is_kept_until_the_grace_ends(tmp_path):
    being_made = tmp_path / ".0123abcd"  # made, not yet locked and named (claim)
    lockless = tmp_path / "lockless"
    being_made.mkdir()
    lockless.mkdir()
    assert sweep(tmp_path) == []
    old = time.time() - CREATING_GRACE_S - 1
    for path in (being_made, lockless):
        os.utime(path, (old, old))
    assert sorted(sweep(tmp_path)) == sorted([being_made, lockless])


def test_a_claimed_directory_is_named_only_once_its_lock_is_held(tmp_path):
    path, fd = claim(tmp_path)
    try:
        assert [p.name for p in tmp_path.iterdir()] == [path.name]
        assert not path.name.startswith(".") and (path / LOCK_NAME).is_file()
        assert sweep(tmp_path) == []
    finally:
        os.close(fd)


def test_each_child_holds_its_own_directory_and_a_killed_ones_goes_at_the_next_start(
    var_dir, started, tmp_path
):
    first = start_stage_process(CHILD, [], tmp_path / "first.log")
    started.append(first)
    environment = environ_of(first.pid)
    scratch = environment["TMPDIR"]
    assert environment["SPARK_LOCAL_DIRS"] == scratch
    assert os.path.dirname(scratch) == str(scratch_root()) == str(var_dir / "scratch")
    assert os.path.isfile(os.path.join(scratch, LOCK_NAME))
    # The launcher closed its copy of the lock: only the child holds it, so a sweep keeps it.
    assert sweep(scratch_root()) == []
    with open(os.path.join(scratch, "left-behind.tmp"), "wb") as handle:
        handle.write(b"what a killed driver leaves")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    second = start_stage_process(CHILD, [], tmp_path / "second.log")
    started.append(second)
    wait_until(lambda: not os.path.exists(scratch), 10, "the killed child's directory swept")
    other = environ_of(second.pid)["TMPDIR"]
    assert other != scratch and os.path.isdir(other)
    assert [p.name for p in scratch_root().iterdir()] == [os.path.basename(other)]


def test_a_callers_own_tmpdir_wins(var_dir, started, tmp_path):
    mine = tmp_path / "mine"
    proc = start_stage_process(CHILD, [], None, env_overrides={"TMPDIR": str(mine)})
    started.append(proc)
    environment = environ_of(proc.pid)
    assert environment["TMPDIR"] == str(mine)
    assert os.path.dirname(environment["SPARK_LOCAL_DIRS"]) == str(scratch_root())


def test_the_driver_jvm_takes_its_temporary_directory_from_tmpdir(monkeypatch):
    monkeypatch.setenv("BACKSTOP_CDS_ARCHIVE", "")
    monkeypatch.setenv("TMPDIR", "/var/backstop/scratch/abc")
    assert tmpdir_option() == "-Djava.io.tmpdir=/var/backstop/scratch/abc"
    driver = session_conf("local[2]")["spark.driver.extraJavaOptions"]
    assert driver.endswith(" -Djava.io.tmpdir=/var/backstop/scratch/abc")
    # Executors on a cluster run on hosts of their own, with their own temporary directories.
    assert "tmpdir" not in session_conf("spark://master:7077")["spark.executor.extraJavaOptions"]
    monkeypatch.delenv("TMPDIR")
    assert tmpdir_option() == ""
    assert "tmpdir" not in session_conf("local[2]")["spark.driver.extraJavaOptions"]
