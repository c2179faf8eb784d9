"""A stage whose query fails to start because Spark's Python worker did not connect back within
Spark's fixed 10 s (seen on a saturated machine) starts its queries again in the same process,
and its results stay exact.

The slow start is real: Spark runs its Python workers through a wrapper (PYSPARK_PYTHON) that
waits 12 s before the first start of the streaming source's worker, as a starved interpreter
would. A session of its own, since the worker interpreter is fixed when the session starts.
"""

from __future__ import annotations

import os
import stat
import sys

import pytest

from infra.launcher import wait_for
from spark_runtime import generators, keys
from spark_runtime.runtime import CONNECT_BACK_FAILURE, PRIMARY, StageRuntime
from spark_runtime.topology import FUSED, compile_stages, get_topology
from tests.spark_runtime import truth

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def slow_worker_spark(tmp_path_factory):
    from pyspark.sql import SparkSession

    from spark_runtime.config import build_session

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()  # the worker interpreter is fixed when a session's context starts
    folder = tmp_path_factory.mktemp("slow-worker")
    wrapper = folder / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'case "$*" in *python_streaming_source_runner*)\n'
        f'  if [ ! -e "{folder}/slowed" ]; then touch "{folder}/slowed"; sleep 12; fi ;;\n'
        "esac\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    before = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = str(wrapper)
    session = build_session("backstop-tests-start-retry")
    yield session, folder
    session.stop()
    if before is None:
        os.environ.pop("PYSPARK_PYTHON", None)
    else:
        os.environ["PYSPARK_PYTHON"] = before


def test_a_query_whose_worker_connects_back_late_is_started_again(
    slow_worker_spark, redis_conn, redis_url, job, tmp_path
):
    spark, folder = slow_worker_spark
    generators.generate(redis_conn, job, "wordcount", count=400, rate=1e6, seed=11)
    topology = get_topology("wordcount")
    (stage,) = compile_stages(topology, FUSED, job=job)
    runtime = StageRuntime(
        spark, redis_conn, job, topology, stage, PRIMARY, redis_url, str(tmp_path / "checkpoint")
    )
    runtime.start()
    try:
        wait_for(lambda: runtime.failure() is not None, 60, "the slowed start to fail")
        assert CONNECT_BACK_FAILURE in str(runtime.failure())
        assert (folder / "slowed").exists()
        assert runtime.retry_failed_start(runtime.failure()) is True
        assert runtime.failure() is None
        runtime.process_all_available()
    finally:
        runtime.stop()
    assert runtime.start_retries == 1
    expected = truth.wordcount(truth.valid_entries(redis_conn, keys.input_stream(job), ["text"]))
    assert {w: int(c) for w, c in redis_conn.hgetall(keys.results(job)).items()} == expected
