"""An app's run inside a stage process (spark_runtime/app_stage.py, stage.app_failure) on one
real SparkSession: the cause a bad app gets (it raises, exits, or ends without a query), the
checkpoint a query without one gets while an app's own is kept, and a stop that stops the
queries before the app returns."""

from __future__ import annotations

import sys
import time

import pytest

from spark_runtime.app_stage import AppRun, install_checkpoint_defaults, make_app_listener
from spark_runtime.apps import AppDefinition
from spark_runtime.stage import APP_FIRST_QUERY_S, app_failure
from tests.conftest import wait_until

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    from spark_runtime.config import build_session

    session = build_session("backstop-tests-app-stage")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def own_argv(monkeypatch):
    """An app sets sys.argv (its stage process runs nothing else): put the tests' back."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def run_app(spark, source: str, args=()) -> AppRun:
    run = AppRun(spark, AppDefinition("t", "apps/t.py", source), list(args))
    run.start()
    return run


def finished_cause(run: AppRun) -> str | None:
    assert run.finished.wait(60), "the app did not end"
    return app_failure(run, time.time(), time.time())


def test_an_app_that_raises_is_named_by_its_file_and_line(spark):
    source = (
        "import sys\n\n\ndef load(path):\n    raise OSError(f'no {path}')\n\nload(sys.argv[1])\n"
    )
    run = run_app(spark, source, ["/in"])
    assert finished_cause(run) == "apps/t.py line 5: OSError: no /in"
    assert 'File "apps/t.py", line 7' in run.error_text()


def test_an_app_that_exits_or_starts_no_query_says_so(spark):
    assert finished_cause(run_app(spark, "import sys\nsys.exit(3)\n")) == (
        "apps/t.py line 2: the app exited with status 3"
    )
    assert finished_cause(run_app(spark, "print('nothing to do')\n")) == (
        "apps/t.py: the app ended without starting a streaming query"
    )
    # A script still setting up is left alone until APP_FIRST_QUERY_S have passed.
    waiting = run_app(spark, "import time\ntime.sleep(30)\n")
    now = time.time()
    assert app_failure(waiting, now, now + 1) is None
    assert app_failure(waiting, now, now + APP_FIRST_QUERY_S + 1) == (
        f"apps/t.py: no streaming query started within {APP_FIRST_QUERY_S:.0f} s"
    )


APP = """\
import sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
rates = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
rates.writeStream.format("noop").trigger(processingTime="1 second").start()
rates.writeStream.format("noop").queryName("named").start()
rates.writeStream.format("noop").option("checkpointLocation", sys.argv[1]).start()
spark.streams.awaitAnyTermination()
"""


def test_queries_get_checkpoints_unless_they_have_one_and_stop_first(
    spark, tmp_path, redis_conn, job
):
    own = tmp_path / "own"
    install_checkpoint_defaults(str(tmp_path / "replica"))
    run = AppRun(spark, AppDefinition("t", "apps/t.py", APP), [str(own)])
    listener = make_app_listener(redis_conn, job, "job-1", "job", "node", run, lambda: 0)
    spark.streams.addListener(listener)
    run.start()
    wait_until(lambda: len(spark.streams.active) == 3, 60, "the app's three queries")
    assert sorted(p.name for p in (tmp_path / "replica").iterdir()) == ["query-1", "query-named"]
    assert (own / "offsets").is_dir() or (own / "metadata").is_file()
    assert app_failure(run, time.time(), time.time()) is None
    wait_until(lambda: run.started_queries == 3, 30, "the listener to see three queries")
    run.stop()
    spark.streams.removeListener(listener)
    assert spark.streams.active == [] and run.finished.is_set() and run.error is None
    assert app_failure(run, time.time(), time.time()) == (
        "apps/t.py: the app ended and its queries stopped"
    )


def test_an_app_without_room_for_checkpoints_fails_before_its_session(
    redis_conn, job, tmp_path, monkeypatch
):
    import threading

    from spark_runtime.disk_space import MIN_FREE_MB_ENV
    from spark_runtime.stage import EXIT_FAILED, ReplicaState, build_parser, run_app

    monkeypatch.setenv(MIN_FREE_MB_ENV, str(10**9))  # more than any disk here has free
    args = build_parser().parse_args(
        ["--job", job, "--topology", "t@1", "--stage", "job", "--operators", "app",
         "--replica-id", "job-1", "--checkpoint-dir", str(tmp_path / "checkpoints")]
    )  # fmt: skip
    state = ReplicaState(redis_conn, args)
    app = AppDefinition("t", "apps/t.py", "raise SystemExit(0)\n")
    assert run_app(args, redis_conn, state, app, threading.Event()) == EXIT_FAILED
    assert state.info["state"] == "failed"
    assert str(tmp_path / "checkpoints") in state.info["error"]
