"""A full disk under the checkpoints (spark_runtime/disk_space.py, failover.waits_for_space): the
stage's cause names the directory and the space left, and the supervisor restarts a stage
waiting for space with its backoff for as long as it takes, never giving up on it. Pure: no
Spark (but for the last test: a stage process, without a JVM, refusing to start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from spark_runtime import disk_space, keys
from spark_runtime.disk_space import disk_full_cause, is_disk_full, mentions_no_space
from spark_runtime.failover import (
    CauseStreak,
    ExponentialDelayRestartBackoff,
    RestartPolicy,
    waits_for_space,
)
from spark_runtime.replicas import (
    GiveUp,
    HeartbeatSeen,
    ProcessExited,
    RestartStage,
    ScheduleRestart,
    reported_cause,
)
from spark_runtime.supervision import Supervisor

NODES = ["node-1", "node-2", "node-3"]
SCOPE = "count/primary"
MB = 1024 * 1024
PYARROW = "ModuleNotFoundError: No module named 'pyarrow'"
# What a query failing on a full tmpfs said (its first line, and two of its "Caused by" lines,
# from a stage's log), and the one line failure_cause made of it before.
SPARK_ERROR = (
    "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call "
    'last):\n  File ".../py4j/clientserver.py", line 644, in _call_proxy\n'
    "py4j.protocol.Py4JJavaError: An error occurred while calling o135.getResult.\n"
    "Caused by: org.apache.spark.SparkException: [CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT] Error "
    "writing state store files for provider RocksDBStateStore[...]\n"
    "Caused by: org.apache.hadoop.fs.FSError: java.io.IOException: No space left on device\n"
    "\tat org.apache.hadoop.fs.RawLocalFileSystem$LocalFSFileOutputStream.write(...)\n"
    "Caused by: java.io.IOException: No space left on device\n"
)
FULL = "checkpoint directory /ck/j/count/count-1 is full (No space left on device): 0.0 MB free"


def statvfs_of(free_mb: float, size_mb: float):
    """A stand-in for os.statvfs: a filesystem of `size_mb` with `free_mb` available."""
    return lambda _path: SimpleNamespace(
        f_bavail=int(free_mb * 256), f_blocks=int(size_mb * 256), f_frsize=4096
    )


# --- telling a full disk apart -------------------------------------------------------------


def test_an_error_that_says_no_space_is_recognised_and_others_are_not():
    assert mentions_no_space(SPARK_ERROR)
    assert mentions_no_space("OSError: [Errno 28] No space left on device: '/ck/x'")
    assert mentions_no_space("java.io.IOException: Disk quota exceeded")
    assert not mentions_no_space(PYARROW)
    assert not mentions_no_space("ValueError: no space in the key")
    assert is_disk_full(FULL) and waits_for_space(FULL)
    assert not waits_for_space(PYARROW) and not waits_for_space("")


def test_a_failure_that_says_no_space_on_a_full_checkpoint_disk_names_the_directory(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(os, "statvfs", statvfs_of(free_mb=0.0, size_mb=64))
    path = str(tmp_path / "j" / "count" / "count-1")  # not made yet: its ancestor is asked
    cause = disk_full_cause(path, SPARK_ERROR, min_free=16 * MB)
    mount = disk_space.mount_point(str(tmp_path))
    assert cause == (
        f"checkpoint directory {path} is full (No space left on device): 0.0 MB free of 64 MB "
        f"on {mount}"
    )
    assert waits_for_space(cause)


def test_too_little_room_is_a_full_disk_before_any_error(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "statvfs", statvfs_of(free_mb=3.5, size_mb=64))
    mount = disk_space.mount_point(str(tmp_path))
    assert disk_full_cause(str(tmp_path), min_free=16 * MB) == (
        f"checkpoint directory {tmp_path} is full (less than 16 MB free): 3.5 MB free of 64 MB "
        f"on {mount}"
    )
    assert disk_full_cause(str(tmp_path), min_free=3 * MB) is None
    assert disk_full_cause(str(tmp_path), "ValueError: bad row", min_free=3 * MB) is None
    # The environment's setting is the default minimum.
    monkeypatch.setenv(disk_space.MIN_FREE_MB_ENV, "4")
    assert disk_full_cause(str(tmp_path)) is not None
    monkeypatch.setenv(disk_space.MIN_FREE_MB_ENV, "2")
    assert disk_full_cause(str(tmp_path)) is None


def test_no_space_elsewhere_is_a_full_disk_that_says_the_checkpoints_have_room(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(os, "statvfs", statvfs_of(free_mb=900, size_mb=1000))
    cause = disk_full_cause(str(tmp_path), SPARK_ERROR, min_free=16 * MB)
    assert cause.startswith("a disk of this stage is full (No space left on device), not its ")
    assert f"checkpoint directory {tmp_path} (900.0 MB free on " in cause
    assert waits_for_space(cause)


# --- the restart-backoff strategy and the supervisor ---------------------------------------


def test_a_full_disk_counts_toward_neither_give_up_rule_and_ends_a_streak():
    strategy = ExponentialDelayRestartBackoff(
        RestartPolicy(max_failures=3, failure_window_s=600, same_cause_failures_limit=3), {}, {}
    )
    strategy.notify_failure(SCOPE, 0.0, cause=PYARROW)
    strategy.notify_failure(SCOPE, 1.0, cause=PYARROW)
    for at in range(2, 50):  # 48 failures in 48 s, all with the same cause
        strategy.notify_failure(SCOPE, float(at), cause=FULL)
        assert strategy.can_restart(SCOPE)
    assert strategy.failures[SCOPE] == [0.0, 1.0]
    assert SCOPE not in strategy.streaks
    strategy.notify_failure(SCOPE, 50.0, cause=PYARROW)
    assert strategy.streaks[SCOPE] == CauseStreak(PYARROW, 1)
    assert not strategy.can_restart(SCOPE)  # the failure rate: 3 other failures in 600 s


def restart_after(sup: Supervisor, actions: list) -> float:
    """Carry out a failure's answer: wait out a ScheduleRestart through tick(); returns the
    delay."""
    if isinstance(actions[0], ScheduleRestart):
        assert sup.tick(actions[0].at - 0.01) == []
        delay, actions = actions[0].delay_s, sup.tick(actions[0].at)
    else:
        delay = 0.0
    assert isinstance(actions[0], RestartStage), actions
    return delay


def test_a_stage_waiting_for_space_is_restarted_with_the_backoff_and_never_given_up_on():
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES)
    sup.start(0.0)
    # Running, it finished a batch; then the disk fills: the query fails, and every restart
    # fails 1 s after its start (the stage's check before it starts its queries), for 2 hours.
    sup.handle(HeartbeatSeen("count-1", 5.0, {"state": "running", "batches": 3,
                                              "started_at": 0.5}))  # fmt: skip
    delays, now = [], 100.0
    while now < 7200.0:
        actions = sup.handle(ProcessExited("count-1", now, 1, cause=FULL))
        assert not any(isinstance(a, GiveUp) for a in actions), sup.gave_up
        delays.append(restart_after(sup, actions))
        now = sup.replicas["count-1"].launched_at + 1.0
    # The policy's delays (2 s doubling to 60 s): a start a minute at most, no tight loop.
    assert delays[:8] == [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    # Six starts to reach the cap (at 168 s), then one every 61 s up to 7200 s: 6 + 116.
    assert len(delays) == 122 and set(delays[6:]) == {60.0}
    assert sup.gave_up is None and sup.cause_streaks == {} and sup.failures == {SCOPE: []}
    assert sum("waits for disk space" in what for _, what in sup.history) == len(delays)
    # Space is back: the next start resumes the checkpoint and finishes a batch; the count of
    # failures in a row starts again (a later fault restarts at once).
    started = sup.replicas["count-1"].launched_at
    sup.handle(HeartbeatSeen("count-1", now + 20, {"state": "running", "batches": 1,
                                                   "started_at": started + 0.5}))  # fmt: skip
    assert sup.replicas["count-1"].healthy and sup.replicas["count-1"].failures_in_a_row == 0
    actions = sup.handle(ProcessExited("count-1", now + 30, 1, cause=PYARROW))
    assert actions == [RestartStage(sup.replicas["count-1"].spec)]


def test_other_same_cause_failures_still_give_up_while_a_full_disk_does_not():
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES)
    sup.start(0.0)
    for at in (10.0, 20.0):
        sup.tick(at)
        sup.handle(ProcessExited("count-1", at, 1, cause=PYARROW))
    sup.tick(30.0)
    sup.handle(ProcessExited("count-1", 30.0, 1, cause=FULL))  # the streak ends here
    for at in (200.0, 300.0):
        sup.tick(at)
        assert not isinstance(sup.handle(ProcessExited("count-1", at, 1, cause=PYARROW))[-1],
                              GiveUp)  # fmt: skip
    sup.tick(400.0)
    assert isinstance(sup.handle(ProcessExited("count-1", 400.0, 1, cause=PYARROW))[-1], GiveUp)


def test_standbys_waiting_for_space_keep_the_stage_protected():
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "adaptive", NODES, {"count"})
    sup.start(0.0)
    sup.handle(HeartbeatSeen("count-1", 1.0, {"state": "running", "role": "primary"}))
    for at in range(5, 1000, 61):
        sup.tick(float(at))
        actions = sup.handle(ProcessExited("count-2", float(at), 1, cause=FULL))
        assert not any(isinstance(a, GiveUp) for a in actions)
    assert "count" not in sup.unprotectable and sup.has_standby("count")


# --- a stage process refusing to start on a full disk --------------------------------------


def test_a_stage_without_room_for_its_checkpoint_exits_at_once_naming_the_directory(
    redis_conn, redis_url, job, tmp_path
):
    checkpoint = tmp_path / "checkpoints" / job / "count" / "count-1"
    args = ["--job", job, "--topology", "wordcount", "--stage", "count", "--operators",
            "split,count", "--replica-id", "count-1", "--redis-url", redis_url,
            "--checkpoint-dir", str(checkpoint)]  # fmt: skip
    # More room than any disk has: this one is "full".
    env = {**os.environ, disk_space.MIN_FREE_MB_ENV: str(2**50)}
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "spark_runtime.stage", *args],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    elapsed = time.time() - started
    assert done.returncode == 1, done.stderr
    entry = json.loads(redis_conn.hget(keys.replicas(job), "count-1"))
    assert entry["state"] == "failed"
    prefix = f"checkpoint directory {checkpoint} is full (less than {2**50:g} MB free): "
    assert entry["error"].startswith(prefix), entry["error"]
    assert waits_for_space(reported_cause(entry, launched_at=started))
    assert "does not start its queries" in done.stderr
    assert "SparkSession" not in done.stderr  # no JVM was started
    assert not checkpoint.exists()
    print(f"refused in {elapsed:.1f} s")
    assert elapsed < 30


@pytest.mark.parametrize("text", ["", "ValueError: bad row"])
def test_plenty_of_room_is_not_a_full_disk(tmp_path, text):
    assert disk_full_cause(str(tmp_path), text, min_free=1) is None
