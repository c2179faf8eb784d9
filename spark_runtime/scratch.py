"""Each started process's scratch directory: its temporary files, removed once it is gone.

A Spark driver keeps its shuffle files, the working copies of its RocksDB state stores, its
artifacts and the native libraries it unpacks in temporary directories (`spark.local.dir` and
`java.io.tmpdir`, /tmp by default), and deletes them when it stops cleanly. A stage ended by a
fault (kill-driver, a lost node, the kernel's OOM killer) leaves them behind: up to 25 MB per
stage of a stateful job, and on a machine that had run two days of tests and benchmarks, 5.9 GB
in 1,500 directories of /tmp.

So every process spark_runtime/launch.py starts gets a directory of its own under
`<BACKSTOP_VAR_DIR>/scratch` as its TMPDIR and SPARK_LOCAL_DIRS (and the JVM's
`java.io.tmpdir`, spark_runtime/config.py). The launcher creates it under a dot-name, takes an
exclusive `flock` on its lock file, and only then gives it its name, so that a sweep never
finds a named directory whose lock is not yet held. It hands that descriptor to the child,
whose copy holds the lock for the rest of its life: the kernel releases it however the
process ends, SIGKILL included, and no pid is compared (pids are reused). `sweep` removes
every named directory whose lock no process holds, holding the lock while it removes it; the
launcher sweeps after each start, so what a killed process left goes at the next start of a
process on the machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
import uuid
from pathlib import Path

LOCK_NAME = ".lock"
# Where a directory is made before it is locked and named.
CREATING_PREFIX = "."
# A directory still being made, or one without a lock file, is left alone this long: a creator
# that died before naming it leaves it behind, and the sweep takes it then.
CREATING_GRACE_S = 60.0


def claim(root: Path) -> tuple[Path, int]:
    """A new scratch directory under `root` and an open descriptor holding its lock. Pass the
    descriptor to the process that owns the directory and close it here: the lock lasts while
    any copy of it is open."""
    name = uuid.uuid4().hex
    making = root / f"{CREATING_PREFIX}{name}"
    making.mkdir(parents=True)
    fd = os.open(making / LOCK_NAME, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else knows the name yet
        path = root / name
        making.rename(path)
    except OSError:
        os.close(fd)
        raise
    return path, fd


def scratch_environment(path: Path) -> dict[str, str]:
    """The variables that send a process's temporary files to `path`: Python's and most
    programs' (TMPDIR) and Spark's local directories (SPARK_LOCAL_DIRS)."""
    return {"TMPDIR": str(path), "SPARK_LOCAL_DIRS": str(path)}


def _older_than_grace(path: Path, now: float) -> bool:
    try:
        return now - path.stat().st_mtime > CREATING_GRACE_S
    except FileNotFoundError:  # removed meanwhile by another sweep
        return False


def _remove_if_abandoned(path: Path, now: float) -> bool:
    """Remove `path` if no process holds its lock (a directory being made, or one without a
    lock file, once it is older than CREATING_GRACE_S); True if it was removed."""
    fd = None
    if not path.name.startswith(CREATING_PREFIX):
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(path / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
    if fd is None:
        if not _older_than_grace(path, now):
            return False
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
    try:  # holding the lock, if there is one, while the directory goes
        shutil.rmtree(path, ignore_errors=True)
    finally:
        if fd is not None:
            os.close(fd)
    return True


def sweep(root: Path) -> list[Path]:
    """Remove the scratch directories under `root` that no live process holds; returns them.
    Safe to run from several processes at once."""
    if not root.is_dir():
        return []
    now = time.time()
    return [p for p in root.iterdir() if p.is_dir() and _remove_if_abandoned(p, now)]
