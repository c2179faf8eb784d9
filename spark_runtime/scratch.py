"""Each started process's scratch directory: its temporary files, removed once it is gone.

A Spark driver keeps its shuffle files, the working copies of its RocksDB state stores, its
artifacts and the native libraries it unpacks in temporary directories (`spark.local.dir` and
`java.io.tmpdir`, /tmp by default), and deletes them when it stops cleanly. A stage ended by a
fault (kill-driver, a lost node, the kernel's OOM killer) leaves them behind: up to 25 MB per
stage of a stateful job, and on a machine that had run two days of tests and benchmarks, 5.9 GB
in 1,500 directories of /tmp.

So every process spark_runtime/launch.py starts gets a directory of its own under
`<BACKSTOP_VAR_DIR>/scratch` as its TMPDIR and SPARK_LOCAL_DIRS (and the JVM's
`java.io.tmpdir`, spark_runtime/config.py). The launcher creates it holding an exclusive
`flock` on its lock file and hands that descriptor to the child, whose copy holds the lock for
the rest of its life: the kernel releases it however the process ends, SIGKILL included, and
no pid is compared (pids are reused). `sweep` removes every directory whose lock no process
holds; the launcher sweeps after each start, so what a killed process left goes at the next
start of a process on the machine.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
import uuid
from pathlib import Path

LOCK_NAME = ".lock"
# A directory is created, then locked: one younger than this without its lock file is a start
# under way, not a leftover.
CREATING_GRACE_S = 60.0


def claim(root: Path) -> tuple[Path, int]:
    """A new scratch directory under `root` and an open descriptor holding its lock. Pass the
    descriptor to the process that owns the directory and close it here: the lock lasts while
    any copy of it is open."""
    path = root / uuid.uuid4().hex
    path.mkdir(parents=True)
    fd = os.open(path / LOCK_NAME, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return path, fd


def scratch_environment(path: Path) -> dict[str, str]:
    """The variables that send a process's temporary files to `path`: Python's and most
    programs' (TMPDIR) and Spark's local directories (SPARK_LOCAL_DIRS)."""
    return {"TMPDIR": str(path), "SPARK_LOCAL_DIRS": str(path)}


def _abandoned(path: Path, now: float) -> bool:
    """True when no process holds `path`'s lock (a directory without a lock file counts once it
    is older than CREATING_GRACE_S)."""
    try:
        fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            return now - path.stat().st_mtime > CREATING_GRACE_S
        except FileNotFoundError:  # removed meanwhile by another sweep
            return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def sweep(root: Path) -> list[Path]:
    """Remove the scratch directories under `root` that no live process holds; returns them.
    Safe to run from several processes at once."""
    if not root.is_dir():
        return []
    now = time.time()
    removed = []
    for path in root.iterdir():
        if path.is_dir() and _abandoned(path, now):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
