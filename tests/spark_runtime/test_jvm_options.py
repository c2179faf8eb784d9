"""The JVM options of data-plane sessions (spark_runtime/config.py): which settings carry them
and how BACKSTOP_JVM_OPTIONS replaces them. The running JVM's own view of its options is
checked in test_topologies.py (a real session)."""

from __future__ import annotations

from spark_runtime.config import JVM_OPTIONS, JVM_OPTIONS_ENV, jvm_options, session_conf

DRIVER, EXECUTOR = "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"


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
