"""Existing apps run unchanged under the local runner's supervision (restart-all): the example
apps of jobs/apps/ (plain PySpark) through a kill of the app's process, their output exact
against a plain-Python computation of the input files (0 lost, 0 duplicated), and an app that
raises on start given up on within 4 starts, naming its file and line."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from spark_runtime import apps, keys
from spark_runtime.failover import RestartPolicy
from spark_runtime.jobdef import registered_path
from spark_runtime.progress import read_progress
from spark_runtime.runner import build_runner
from tests.app_files import (
    START,
    USERS,
    committed_rows,
    iso,
    large_found,
    newest_totals,
    purchases,
    spend_expected,
    write_input,
)
from tests.conftest import wait_until

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "apps"


@pytest.fixture
def jobs(tmp_path, monkeypatch) -> Path:
    """A jobs directory with the example apps; the stage processes inherit it."""
    directory = tmp_path / "jobs"
    shutil.copytree(EXAMPLES, directory / "apps")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    return directory


def register(jobs: Path, path: str, name: str) -> str:
    """Write the snapshot registration writes (console/services/topologies.py); NAME@1."""
    snapshot = registered_path(name, 1, jobs)
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.write_text(apps.snapshot_text(path, jobs))
    return f"{name}@1"


@pytest.fixture
def launch(tmp_path, redis_url, redis_conn):
    """Start an app job under the local runner; every runner is shut down at the end."""
    runners = []

    def start(topology: str, job: str, args: list[str], policy: RestartPolicy | None = None):
        keys.delete_job_keys(redis_conn, job)
        redis_conn.set(keys.app_args(job), json.dumps(args))
        runner = build_runner(
            topology,
            job,
            "restart-all",
            redis_url,
            redis_conn,
            checkpoint_root=str(tmp_path / "checkpoints"),
            log_dir=str(tmp_path / "logs"),
            restart_policy=policy,
        )
        starts = []
        launch_replica = runner.launcher.start

        def counted(replica):
            starts.append(time.time())
            launch_replica(replica)

        runner.launcher.start = counted
        runner.starts = starts
        runner.start()
        runners.append(runner)
        return runner

    yield start
    for runner in runners:
        runner.shutdown()
        keys.delete_job_keys(redis_conn, runner.job)


def serve(runner, seconds: float, until, what: str):
    """Supervise until `until()` is true and return its value; fail after `seconds`, or at once
    if the supervisor gives up."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        runner.tick()
        if runner.supervisor.gave_up:
            raise AssertionError(f"gave up: {runner.supervisor.gave_up}")
        found = until()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")


def kill_app(runner) -> None:
    """SIGKILL the app's process (its JVM and Python workers with it)."""
    [replica] = [r.id for r in runner.supervisor.live()]
    runner.launcher.kill(replica)


def clicks(file: int) -> list[dict]:
    """Ten clicks per file, one second apart in event time, file after file."""
    rows = []
    for n in range(10):
        second = file * 10 + n
        moment = iso(START + timedelta(seconds=second))
        rows.append({"user": USERS[(file + n) % 3], "page": "p", "ts": moment})
    return rows


def closed_windows(rows: list[dict], delay_s: int = 5) -> Counter:
    """Clicks per (user, 10 s window) of the windows the watermark (the newest event time less
    the app's 5 s delay) has closed: what the app's append-mode output holds at the end."""
    times = [datetime.fromisoformat(r["ts"].replace("Z", "+00:00")) for r in rows]
    watermark = max(times) - timedelta(seconds=delay_s)
    counts = Counter()
    for row, moment in zip(rows, times, strict=True):
        start = moment.replace(second=moment.second - moment.second % 10, microsecond=0)
        if start + timedelta(seconds=10) <= watermark:
            counts[(row["user"], start.strftime("%Y-%m-%dT%H:%M:%SZ"))] += 1
    return counts


def test_window_counts_to_a_file_sink_are_exact_through_a_kill(jobs, tmp_path, launch):
    source, out = tmp_path / "in", tmp_path / "out"
    topology = register(jobs, "apps/window_counts.py", "windows")
    written = []
    for file in range(3):
        write_input(source, file, clicks(file))
        written += clicks(file)
    runner = launch(topology, "app-windows", ["--in", str(source), "--out", str(out)])
    serve(runner, 120, lambda: committed_rows(out), "the first committed windows")
    kill_app(runner)
    for file in range(3, 8):
        write_input(source, file, clicks(file))
        written += clicks(file)
    expected = closed_windows(written)

    def output():
        return Counter({(r["user"], r["window_start"]): r["clicks"] for r in committed_rows(out)})

    serve(runner, 120, lambda: output() == expected, "exact windows after the restart")
    rows = committed_rows(out)
    keyed = Counter((r["user"], r["window_start"]) for r in rows)
    assert [k for k, n in keyed.items() if n > 1] == []  # nothing duplicated
    assert output() == expected  # nothing lost, nothing wrong
    assert len(runner.starts) == 2  # the kill restarted it once, from its checkpoint
    checkpoints = tmp_path / "checkpoints" / "app-windows" / "job" / "job-1"
    assert [p.name for p in checkpoints.iterdir()] == ["query-1"]


def test_two_queries_with_a_foreach_batch_sink_are_exact_through_a_kill(
    jobs, tmp_path, launch, redis_conn
):
    source, out = tmp_path / "in", tmp_path / "out"
    topology = register(jobs, "apps/spend_totals.py", "spend")
    written = []
    for file in range(3):
        write_input(source, file, purchases(file))
        written += purchases(file)
    args = ["--in", str(source), "--out", str(out), "--large", "70"]
    runner = launch(topology, "app-spend", args)
    serve(runner, 120, lambda: newest_totals(out / "totals") and large_found(out), "first output")
    kill_app(runner)
    for file in range(3, 8):
        write_input(source, file, purchases(file))
        written += purchases(file)
    totals, large = spend_expected(written, 70)

    def done():
        return newest_totals(out / "totals") == totals and large_found(out) == large

    serve(runner, 120, done, "exact totals and large purchases after the restart")
    assert newest_totals(out / "totals") == totals  # every user's newest total exact
    assert large_found(out) == large  # each large purchase once: 0 lost, 0 duplicated
    assert len(runner.starts) == 2
    checkpoints = tmp_path / "checkpoints" / "app-spend" / "job" / "job-1"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["query-large", "query-totals"]
    # Each query's progress reached the job's progress stream, under its own name.
    queries = {record.query for record in read_progress(redis_conn, "app-spend")}
    assert queries == {"totals", "large"}


RAISES = """\
import sys

from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
source = sys.argv[1]
raise RuntimeError(f"cannot read {source}")
"""


def test_an_app_that_raises_on_start_is_given_up_within_4_starts(jobs, launch):
    (jobs / "apps" / "raises.py").write_text(RAISES)
    topology = register(jobs, "apps/raises.py", "raises")
    policy = RestartPolicy(initial_delay_s=1.0)
    runner = launch(topology, "app-raises", ["/data/in"], policy)
    wait_until(lambda: runner.tick() or runner.supervisor.gave_up, 150, "the job to be given up on")
    assert len(runner.starts) <= 4
    reason = runner.supervisor.gave_up
    assert "apps/raises.py line 7: RuntimeError: cannot read /data/in" in reason
    assert "same cause" in reason
