"""The class-data archive for real (spark_runtime/class_sharing.py): built by its own command
from a spare's warm-up, then mapped by a stage session's JVM (two JVMs, about 45 s)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spark_runtime.class_sharing import ARCHIVE_ENV

pytestmark = pytest.mark.spark

# A data-plane session started as a stage starts one; prints which files its JVM maps.
MAPS_OF_A_STAGE_JVM = """
from spark_runtime.config import build_session
from pyspark import SparkContext
spark = build_session("test-class-sharing")
spark.range(3).count()
print(open(f"/proc/{SparkContext._gateway.proc.pid}/maps").read())
"""


def test_the_archive_is_built_once_and_a_stage_jvm_maps_it(tmp_path, redis_url):
    archive = tmp_path / "cds" / "spark.jsa"
    env = {**os.environ, ARCHIVE_ENV: str(archive)}
    built = subprocess.run(
        [sys.executable, "-m", "spark_runtime.class_sharing_build", "--redis-url", redis_url],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert f"wrote {archive}" in built.stdout
    assert archive.stat().st_size > 50 * 2**20  # Spark's classes, not an empty dump
    assert not list(archive.parent.glob("*.tmp"))
    mapped = subprocess.run(
        [sys.executable, "-c", MAPS_OF_A_STAGE_JVM],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert mapped.returncode == 0, mapped.stderr[-2000:]
    regions = [line for line in mapped.stdout.splitlines() if line.endswith(str(archive))]
    # Its read-write and read-only regions, at the address it was dumped for.
    assert {line.split()[1] for line in regions} >= {"rw-p", "r--p"}, regions
    assert all(line.startswith("80") for line in regions), regions
