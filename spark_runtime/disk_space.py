"""A full disk under a stage's checkpoint directory: telling it from other failures, saying so.

A stage whose checkpoint directory's filesystem is full fails its next batch: RocksDB's
changelog (or Spark's offset and commit logs) cannot be written, and Spark wraps the
`java.io.IOException: No space left on device` several exceptions deep (the one-line
cause of such a failure was "py4j.protocol.Py4JJavaError: An error occurred while
calling o135.getResult."). The stage says instead which directory is full and how much room is
left (`disk_full_cause`), checks before it starts its queries too (`DiskFull`: a restart while
the disk is still full then fails in a second, without a JVM), and the supervisor treats such a
cause as waiting for space, not as a deterministic failure (spark_runtime.failover,
`waits_for_space`): it retries with its backoff and does not give up.

Pure Python without Spark; only `free_space` asks the operating system (statvfs).
"""

from __future__ import annotations

import os

from spark_runtime.env import env

# What an operating system's "disk full" looks like in an error's text (Java's IOException
# message is strerror's; Python's OSError adds the errno). EDQUOT too: a user's quota on the
# checkpoint filesystem is full in the same way, and waits for an operator in the same way.
NO_SPACE = "No space left on device"
QUOTA = "Disk quota exceeded"
MARKERS = (NO_SPACE, "ENOSPC", "[Errno 28]", QUOTA, "EDQUOT", "[Errno 122]")

# A stage does not start its queries with less free space than this on its checkpoint's
# filesystem (each batch writes its offsets, commit and state changelog files there; RocksDB
# uploads a snapshot of its state from time to time). `BACKSTOP_CHECKPOINT_MIN_FREE_MB` sets it.
MIN_FREE_MB_ENV = "BACKSTOP_CHECKPOINT_MIN_FREE_MB"
DEFAULT_MIN_FREE_MB = 16.0
MB = 1024 * 1024


class DiskFull(RuntimeError):
    """The checkpoint directory's filesystem has no room for the stage (`str()` is the cause)."""


def min_free_bytes() -> int:
    """The free space a stage needs on its checkpoint's filesystem to start (bytes)."""
    mb = env(MIN_FREE_MB_ENV, DEFAULT_MIN_FREE_MB, float)
    return int(max(0.0, mb) * MB)


def mentions_no_space(text: str) -> bool:
    """True when an error's text says a disk (or a quota) is full."""
    return any(marker in text for marker in MARKERS)


def existing_ancestor(path: str) -> str:
    """`path`, or its nearest ancestor that exists (a new replica's folder is not made yet)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def mount_point(path: str) -> str:
    """The mount point of the filesystem that holds `path` (which exists)."""
    path = os.path.abspath(path)
    device = os.stat(path).st_dev
    while True:
        parent = os.path.dirname(path)
        if parent == path or os.stat(parent).st_dev != device:
            return path
        path = parent


def free_space(path: str) -> tuple[int, int, str] | None:
    """(free bytes, size in bytes, mount point) of the filesystem of `path` (or of its nearest
    existing ancestor); None when the system cannot tell. Free is what an unprivileged writer
    may still use (statvfs f_bavail, as `df` and `shutil.disk_usage` report it)."""
    try:
        where = existing_ancestor(path)
        stats = os.statvfs(where)
        return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize, mount_point(where)
    except OSError:
        return None


def describe(path: str, reason: str, space: tuple[int, int, str] | None) -> str:
    """The one-line cause: "checkpoint directory P is full (REASON): N MB free of M MB on /mnt"."""
    where = ""
    if space is not None:
        free, size, mount = space
        where = f": {free / MB:.1f} MB free of {size / MB:.0f} MB on {mount}"
    return f"checkpoint directory {path} is full ({reason}){where}"


def disk_full_cause(path: str, error: str = "", min_free: int | None = None) -> str | None:
    """The cause to report when the checkpoint directory `path` is full, else None: `error`
    (a failure's text, "" before a start) says a disk is full, or the filesystem of `path` has
    less than `min_free` bytes free (min_free_bytes() by default).

    An error that says "no space" while `path` has room is still reported as a full disk (it
    waits for an operator like one), but says where there was room: Spark's local directories
    (its scratch directory, spark_runtime/scratch.py: shuffle files, RocksDB's working copy)
    may be the full one.
    """
    limit = min_free_bytes() if min_free is None else min_free
    space = free_space(path)
    low = space is not None and space[0] < limit
    said = mentions_no_space(error)
    if not (low or said):
        return None
    reason = QUOTA if QUOTA in error or "EDQUOT" in error else NO_SPACE
    if said and not low and space is not None:
        return (
            f"a disk of this stage is full ({reason}), not its checkpoint directory {path} "
            f"({space[0] / MB:.1f} MB free on {space[2]}): Spark's local directory?"
        )
    if not said:
        reason = f"less than {limit / MB:g} MB free"
    return describe(path, reason, space)


def is_disk_full(cause: str) -> bool:
    """True for a reported cause that is a full disk (what disk_full_cause returns, or any error
    text that says so): the failure lasts until an operator frees space, then goes away."""
    return mentions_no_space(cause) or (
        cause.startswith("checkpoint directory ") and " is full (" in cause
    )
