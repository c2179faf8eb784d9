"""The JVM options of data-plane sessions (spark_runtime/config.py): which settings carry them
and how BACKSTOP_JVM_OPTIONS replaces them. The running JVM's own view of its options is
checked in test_topologies.py (a real session)."""

from __future__ import annotations

import os

import pytest

from spark_runtime.class_sharing import (
    ARCHIVE_ENV,
    archive_path,
    ensure_archive,
    sharing_options,
    take_build_lock,
)
from spark_runtime.config import JVM_OPTIONS, JVM_OPTIONS_ENV, jvm_options, session_conf

DRIVER, EXECUTOR = "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"


@pytest.fixture(autouse=True)
def no_class_sharing(monkeypatch):
    """The machine's class-data archive, if one was built, stays out unless a test asks; so
    does a TMPDIR of the environment (test_scratch.py checks what it adds)."""
    monkeypatch.setenv(ARCHIVE_ENV, "")
    monkeypatch.delenv("TMPDIR", raising=False)


def test_every_session_gives_its_driver_and_executors_the_jvm_options(monkeypatch):
    monkeypatch.delenv(JVM_OPTIONS_ENV, raising=False)
    for master in ("local[2]", "spark://master:7077"):
        conf = session_conf(master)
        assert conf[DRIVER] == conf[EXECUTOR] == "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    assert jvm_options() == JVM_OPTIONS


def test_the_environment_replaces_the_options_and_empty_means_none(monkeypatch):
    monkeypatch.setenv(JVM_OPTIONS_ENV, " -Xss2m ")
    assert session_conf("local[2]")[DRIVER] == "-Xss2m"
    monkeypatch.setenv(JVM_OPTIONS_ENV, "")
    conf = session_conf("local[2]")
    assert DRIVER not in conf and EXECUTOR not in conf


def test_a_callers_extra_conf_still_wins(monkeypatch):
    monkeypatch.delenv(JVM_OPTIONS_ENV, raising=False)
    assert session_conf("local[2]", {DRIVER: "-Xint"})[DRIVER] == "-Xint"


def test_the_driver_maps_the_class_data_archive_once_it_exists(monkeypatch, tmp_path):
    monkeypatch.delenv(JVM_OPTIONS_ENV, raising=False)
    archive = tmp_path / "spark.jsa"
    monkeypatch.setenv(ARCHIVE_ENV, str(archive))
    assert archive_path() == archive and sharing_options() == ""
    assert session_conf("local[2]")[DRIVER] == JVM_OPTIONS  # not built yet
    archive.write_bytes(b"an archive")
    conf = session_conf("spark://master:7077")
    assert conf[DRIVER] == (
        f"{JVM_OPTIONS} -XX:+UnlockDiagnosticVMOptions -XX:ArchiveRelocationMode=0 "
        f"-XX:SharedArchiveFile={archive}"
    )
    # Executors run on other hosts, which have archives of their own or none.
    assert conf[EXECUTOR] == JVM_OPTIONS
    monkeypatch.setenv(JVM_OPTIONS_ENV, "")  # no options, sharing still
    assert session_conf("local[2]")[DRIVER].startswith("-XX:+UnlockDiagnosticVMOptions")


def test_an_empty_setting_turns_sharing_off_and_one_build_runs_at_a_time(monkeypatch, tmp_path):
    assert archive_path() is None and sharing_options() == ""
    assert ensure_archive("redis://127.0.0.1:1/0", tmp_path / "build.log") is None
    archive = tmp_path / "cds" / "spark.jsa"
    monkeypatch.setenv(ARCHIVE_ENV, str(archive))
    archive.parent.mkdir()
    held = take_build_lock(archive)  # another agent's builder holds the lock: it builds
    assert held is not None
    assert ensure_archive("redis://127.0.0.1:1/0", tmp_path / "build.log") is None
    assert not (tmp_path / "build.log").exists()
    # A builder that died does not hold the next one back: the kernel freed its lock.
    os.close(held)
    left_by_it = archive.parent / "spark.4242.tmp"
    left_by_it.write_bytes(b"half an archive")
    builder = ensure_archive("redis://127.0.0.1:1/0", tmp_path / "build.log")
    assert builder is not None
    builder.wait(timeout=120)
    # No Redis there: the build fails, says so in its log, leaves no archive and frees the lock.
    assert builder.returncode != 0 and not archive.exists()
    freed = take_build_lock(archive)
    assert freed is not None
    os.close(freed)
    assert not left_by_it.exists()
    assert "Error" in (tmp_path / "build.log").read_text()
