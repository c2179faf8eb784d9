"""Class-data sharing for the stage JVMs: one archive of the classes a stage loads, mapped by
every later JVM on the machine (no Django).

    python -m spark_runtime.class_sharing [--redis-url URL]

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
this module, run as a process, warms a session up the way a warm spare does, then exits its
JVM, which writes the archive as it exits.

One builder at a time: the builder holds an exclusive `flock` on the lock file beside the
archive (`take_build_lock`) for as long as it lives. The kernel releases it when the builder
exits, however it dies, so a lock is never stale, and no age of a file decides whether someone
still builds (two agents that judged a slow build's lock stale both took it). The builder ends
itself after BUILD_TIMEOUT_S, so a hung build frees the lock too. The file itself is never
removed: a process that opened it before the removal would lock a file nobody else sees.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from importlib.metadata import version
from pathlib import Path

from spark_runtime import keys
from spark_runtime.stage_env import stage_environment

log = logging.getLogger(__name__)

ARCHIVE_ENV = "BACKSTOP_CDS_ARCHIVE"
# How long a build may take: the builder ends itself then, which releases its lock.
BUILD_TIMEOUT_S = 300.0
# A build is an optimisation that nothing waits for: below every stage process.
BUILD_NICE = 19
# The JVM writes the archive while it exits: a few seconds for 150 MB.
EXIT_TIMEOUT_S = 120.0


def default_archive() -> Path:
    """The archive for this PySpark and this JDK, under BACKSTOP_VAR_DIR (default: `var/` of
    the project): a JVM maps only an archive dumped by its own JDK from the same jars. Read
    without importing PySpark: node agents call it at their start."""
    java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin"))
    java = java or shutil.which("java") or "java"
    jdk = hashlib.sha256(os.path.realpath(java).encode()).hexdigest()[:8]
    var = Path(os.environ.get("BACKSTOP_VAR_DIR") or Path(__file__).resolve().parents[1] / "var")
    return var / "cds" / f"spark-{version('pyspark')}-jdk-{jdk}.jsa"


def archive_path() -> Path | None:
    """Where the archive is (or goes): BACKSTOP_CDS_ARCHIVE if set (empty: no sharing), else
    `default_archive()`."""
    configured = os.environ.get(ARCHIVE_ENV)
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
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "spark_runtime.class_sharing", "--redis-url", redis_url,
                 "--archive", str(archive)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(fd,),
                # It runs Spark like a stage: none of this process's secrets (stage_env.py).
                env=stage_environment(REDIS_URL=redis_url),
            )  # fmt: skip
    finally:
        os.close(fd)  # the builder's copy holds the lock from here on
    threading.Thread(target=proc.wait, name="class-sharing-build", daemon=True).start()
    log.info("building the class-data archive %s (pid %d, log %s)", archive, proc.pid, log_path)
    return proc


def build(archive: Path, redis_url: str) -> bool:
    """Warm a session up as a warm spare does (spark_runtime.spare.warm_up), then exit its JVM,
    which dumps the classes it loaded to a temporary file, renamed to `archive` once whole.
    True when the archive was written."""
    from py4j.protocol import Py4JError
    from pyspark import SparkContext

    from spark_runtime.config import build_session, jvm_options
    from spark_runtime.redis_client import connect
    from spark_runtime.spare import warm_up

    client = connect(redis_url)
    client.ping()  # the warm-up reads a stream: no Redis, no JVM started for nothing
    partial = archive.with_suffix(f".{os.getpid()}.tmp")
    # What a stage loads, with Backstop's JVM options and no archive mapped.
    options = f"{jvm_options()} -XX:ArchiveClassesAtExit={partial} -Xlog:cds=off".strip()
    spark = build_session("backstop-class-sharing", {"spark.driver.extraJavaOptions": options})
    warm_up(
        spark, client, redis_url, keys.class_sharing_warmup_stream(os.getpid()), threading.Event()
    )
    jvm = SparkContext._gateway.proc  # the driver JVM (spark-submit execs java)
    # The call never returns: the JVM exits under it (py4j then fails to reach it again).
    with contextlib.suppress(Py4JError, OSError):
        spark._jvm.java.lang.System.exit(0)
    jvm.wait(timeout=EXIT_TIMEOUT_S)
    if jvm.returncode != 0 or not partial.is_file():
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        return False
    os.replace(partial, archive)
    return True


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m spark_runtime.class_sharing`: build the archive now, at the
    lowest CPU priority (its JVM inherits it): nothing waits for it."""
    from spark_runtime.config import DEFAULT_REDIS_URL

    os.nice(BUILD_NICE)
    parser = argparse.ArgumentParser(prog="python -m spark_runtime.class_sharing")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--archive", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    archive = args.archive or archive_path()
    if archive is None:
        print(f"{ARCHIVE_ENV} is empty: class-data sharing is off")
        return 2
    archive.parent.mkdir(parents=True, exist_ok=True)
    # A build that hangs must not hold the lock (inherited from ensure_archive) for ever: end
    # this process, which releases it, and the next agent start tries again.
    deadline = threading.Timer(BUILD_TIMEOUT_S, os._exit, args=(3,))
    deadline.daemon = True
    deadline.start()
    started = time.monotonic()
    written = build(archive, args.redis_url)
    took = time.monotonic() - started
    if not written:
        print(f"no archive written ({took:.0f} s): the JVM did not dump its classes")
        return 1
    print(f"wrote {archive} ({archive.stat().st_size / 2**20:.0f} MB) in {took:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
