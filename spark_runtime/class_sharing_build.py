"""The class-data archive's builder process (spark_runtime/class_sharing.py says why and how it
is shared):

    python -m spark_runtime.class_sharing_build [--redis-url URL] [--archive PATH]

Started by `class_sharing.ensure_archive`, which passes it the build lock; it warms a session
up as a warm spare does and exits its JVM, which dumps the classes it loaded (no Django).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import threading
import time
from pathlib import Path

from py4j.protocol import Py4JError
from pyspark import SparkContext

from spark_runtime import keys
from spark_runtime.class_sharing import ARCHIVE_ENV, BUILD_TIMEOUT_S, archive_path
from spark_runtime.config import DEFAULT_REDIS_URL, build_session, jvm_options, tmpdir_option
from spark_runtime.env import env
from spark_runtime.redis_client import connect
from spark_runtime.spare import warm_up

# A build is an optimisation that nothing waits for: below every stage process.
BUILD_NICE = 19
# The JVM writes the archive while it exits: a few seconds for 150 MB.
EXIT_TIMEOUT_S = 120.0


def build(archive: Path, redis_url: str) -> bool:
    """Warm a session up as a warm spare does (spark_runtime.spare.warm_up), then exit its JVM,
    which dumps the classes it loaded to a temporary file, renamed to `archive` once whole.
    True when the archive was written."""
    client = connect(redis_url)
    client.ping()  # the warm-up reads a stream: no Redis, no JVM started for nothing
    partial = archive.with_suffix(f".{os.getpid()}.tmp")
    # What a stage loads, with Backstop's JVM options and no archive mapped.
    options = (
        f"{jvm_options()} -XX:ArchiveClassesAtExit={partial} -Xlog:cds=off {tmpdir_option()}"
    ).strip()
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
    """Entry point of `python -m spark_runtime.class_sharing_build`: build the archive now, at the
    lowest CPU priority (its JVM inherits it): nothing waits for it."""
    os.nice(BUILD_NICE)
    parser = argparse.ArgumentParser(prog="python -m spark_runtime.class_sharing_build")
    parser.add_argument("--redis-url", default=env("REDIS_URL", DEFAULT_REDIS_URL))
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
