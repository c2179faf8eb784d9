"""Class-data sharing for the stage JVMs: one archive of the classes a stage loads, mapped by
every later JVM on the machine (no Django). Where the archive is, the options that map it, and
the start of its builder (spark_runtime/class_sharing_build.py, its own process):

    python -m spark_runtime.class_sharing_build [--redis-url URL]

Why: every stage process (primary, standby, warm spare) starts a JVM that loads about 150 MB
of class metadata, Spark's and its libraries', each JVM its own copy. Dumped once into a
dynamic archive (JDK 13+, `-XX:ArchiveClassesAtExit`), the read-only part (about 90 MB) is
mapped from the file by every later JVM and counted once on the machine. Measured on 2 cores,
two idle spares side by side: each JVM 382 MB PSS with the archive against 432 MB without, RSS
unchanged (docs/RESULTS.md, "Spare footprint").

The archive is mapped at the address it was dumped for (`-XX:ArchiveRelocationMode=0`, a
diagnostic option of JDK 17): JDK 17's default maps it elsewhere and rewrites its pointers,
which makes every page of it private to the process and shares nothing. The price is that
these class-data pages are not at a randomised address. `BACKSTOP_CDS_ARCHIVE=` (empty) turns
sharing off; a JVM that cannot map the archive (another JDK, another PySpark) runs without it.

The first node agent on a machine builds the archive in the background (`ensure_archive`):
the builder process warms a session up the way a warm spare does, then exits its JVM, which
writes the archive as it exits. This module imports no session code: the session's own
settings (spark_runtime.config) read `sharing_options` from here.

One builder at a time: the builder holds an exclusive `flock` on the lock file beside the
archive (`take_build_lock`) for as long as it lives. The kernel releases it when the builder
exits, however it dies, so a lock is never stale, and no age of a file decides whether someone
still builds (two agents that judged a slow build's lock stale both took it). The builder ends
itself after BUILD_TIMEOUT_S, so a hung build frees the lock too. The file itself is never
removed: a process that opened it before the removal would lock a file nobody else sees.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from importlib.metadata import version
from pathlib import Path

from spark_runtime.env import env, var_dir
from spark_runtime.launch import ARCHIVE_BUILDER_MODULE, start_stage_process

log = logging.getLogger(__name__)

ARCHIVE_ENV = "BACKSTOP_CDS_ARCHIVE"
# How long a build may take: the builder ends itself then, which releases its lock.
BUILD_TIMEOUT_S = 300.0


def default_archive() -> Path:
    """The archive for this PySpark and this JDK, under BACKSTOP_VAR_DIR (default: `var/` of
    the project): a JVM maps only an archive dumped by its own JDK from the same jars. Read
    without importing PySpark: node agents call it at their start."""
    java = shutil.which("java", path=os.path.join(env("JAVA_HOME", ""), "bin"))
    java = java or shutil.which("java") or "java"
    jdk = hashlib.sha256(os.path.realpath(java).encode()).hexdigest()[:8]
    return var_dir() / "cds" / f"spark-{version('pyspark')}-jdk-{jdk}.jsa"


def archive_path() -> Path | None:
    """Where the archive is (or goes): BACKSTOP_CDS_ARCHIVE if set (empty: no sharing), else
    `default_archive()`."""
    configured = env(ARCHIVE_ENV, None)
    if configured is not None:
        return Path(configured) if configured.strip() else None
    return default_archive()


def sharing_options() -> str:
    """The JVM options that map the archive, where it exists ("" otherwise)."""
    archive = archive_path()
    if archive is None or not archive.is_file():
        return ""
    return (
        "-XX:+UnlockDiagnosticVMOptions -XX:ArchiveRelocationMode=0 "
        f"-XX:SharedArchiveFile={archive}"
    )


def lock_path(archive: Path) -> Path:
    """The lock file of `archive`'s build, beside it."""
    return archive.with_suffix(".building")


def take_build_lock(archive: Path) -> int | None:
    """An open descriptor of `archive`'s lock file holding its exclusive lock, or None when
    another process holds it (builds). The lock lasts as long as the descriptor is open in some
    process: pass it to the builder and close it here."""
    fd = os.open(lock_path(archive), os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def ensure_archive(redis_url: str, log_path: Path) -> subprocess.Popen | None:
    """Start building the archive in the background, at the lowest CPU priority, unless it
    exists, sharing is off, or another process builds it (holds the lock of `take_build_lock`);
    returns the builder process, if one was started (reaped by a thread of this process; its
    output goes to `log_path`). The builder inherits the lock and holds it until it exits."""
    archive = archive_path()
    if archive is None or archive.is_file():
        return None
    archive.parent.mkdir(parents=True, exist_ok=True)
    fd = take_build_lock(archive)
    if fd is None:
        return None
    if archive.is_file():  # a builder finished between the check above and the lock
        os.close(fd)
        return None
    try:
        # Nobody builds: what an earlier builder left half-written goes.
        for partial in archive.parent.glob(f"{archive.stem}.*.tmp"):
            partial.unlink(missing_ok=True)
        # It runs Spark like a stage: none of this process's secrets (stage_env.py).
        proc = start_stage_process(
            ARCHIVE_BUILDER_MODULE,
            ["--redis-url", redis_url, "--archive", str(archive)],
            log_path,
            env_overrides={"REDIS_URL": redis_url},
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)  # the builder's copy holds the lock from here on
    threading.Thread(target=proc.wait, name="class-sharing-build", daemon=True).start()
    log.info("building the class-data archive %s (pid %d, log %s)", archive, proc.pid, log_path)
    return proc
