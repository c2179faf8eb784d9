"""The app benchmark's pure parts (bench/app_restart/workload.py): the reference windows, the
exactness count, the restart measure on a checkpoint's commit files, the arguments."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from io import StringIO
from pathlib import Path

import pytest

from bench.app_restart import workload


def test_closed_windows_count_only_what_the_watermark_has_closed():
    # Files 0..2: event seconds 0..29; the watermark (29 - 5 = 24 s) closes [0,10) and [10,20).
    rows = [row for file in range(3) for row in workload.clicks(file)]
    windows = workload.closed_windows(rows)
    assert sum(windows.values()) == 20
    assert {start for _, start in windows} == {"2026-11-28T10:00:00Z", "2026-11-28T10:00:10Z"}
    # Counted independently: the users of seconds 0..19, click by click.
    by_hand = Counter()
    for second in range(20):
        file, n = divmod(second, workload.CLICKS_PER_FILE)
        user = workload.USERS[(file + n) % len(workload.USERS)]
        by_hand[(user, f"2026-11-28T10:00:{second - second % 10:02d}Z")] += 1
    assert windows == by_hand
    assert workload.closed_windows([]) == Counter()


def test_exactness_counts_lost_duplicated_and_wrong_windows():
    expected = Counter({("u1", "a"): 3, ("u2", "a"): 2, ("u3", "a"): 1})
    rows = [
        {"user": "u1", "window_start": "a", "clicks": 3},
        {"user": "u1", "window_start": "a", "clicks": 3},  # written twice
        {"user": "u2", "window_start": "a", "clicks": 5},  # wrong count
    ]  # u3's window is lost
    assert workload.exactness(expected, rows) == {
        "windows": 3, "lost": 1, "duplicated": 1, "wrong": 1, "exact": False
    }  # fmt: skip
    exact = [{"user": u, "window_start": w, "clicks": n} for (u, w), n in expected.items()]
    assert workload.exactness(expected, exact)["exact"]


def test_committed_rows_read_only_the_files_the_sink_committed(tmp_path):
    (tmp_path / "_spark_metadata").mkdir()
    (tmp_path / "part-a.json").write_text('{"user": "u1", "window_start": "a", "clicks": 1}\n')
    (tmp_path / "part-b.json").write_text('{"user": "u2", "window_start": "a", "clicks": 9}\n')
    entry = json.dumps({"path": f"file://{tmp_path / 'part-a.json'}"})
    (tmp_path / "_spark_metadata" / "0").write_text(f"v1\n{entry}\n")
    assert workload.committed_rows(tmp_path) == [{"user": "u1", "window_start": "a", "clicks": 1}]
    assert workload.committed_rows(tmp_path / "nothing") == []


def test_the_first_commit_after_a_kill_is_the_restart_measure(tmp_path):
    commits = tmp_path / "commits"
    commits.mkdir()
    for batch, written in ((7, 100.0), (8, 130.5), (9, 131.0)):
        (commits / str(batch)).write_text("v1\n{}")
        os.utime(commits / str(batch), (written, written))
    (commits / ".9.crc").write_text("")  # not a commit
    assert workload.first_commit_after(tmp_path, 120.0) == 130.5
    assert workload.first_commit_after(tmp_path, 131.0) is None
    assert workload.first_commit_after(tmp_path / "elsewhere", 0.0) is None


def test_the_args_place_each_runs_directories_and_refuse_others():
    dirs = {"in": "/r/in", "out": "/r/out", "checkpoint": "/r/cp"}
    assert workload.expand_args(workload.DEFAULT_ARGS, dirs) == [
        "--in", "/r/in", "--out", "/r/out", "--checkpoint", "/r/cp"
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"--args: '\{tmp\}'"):
        workload.expand_args("--in {tmp}", dirs)


def test_the_summary_and_the_warm_to_cold_fraction():
    assert workload.summary([2.0, None, 4.0]) == {
        "mean_s": 3.0, "min_s": 2.0, "max_s": 4.0, "missed": 1
    }  # fmt: skip
    assert workload.summary([None])["mean_s"] is None
    assert workload.warm_to_cold(3.0, 12.0) == 0.25
    assert workload.warm_to_cold(None, 12.0) is None


@pytest.fixture
def windows(tmp_path, monkeypatch, db):
    """windows@1: jobs/apps/window_counts.py registered in a jobs directory of the test's."""
    from django.core.management import call_command

    jobs = tmp_path / "jobs"
    shutil.copytree(Path(__file__).resolve().parents[2] / "jobs" / "apps", jobs / "apps")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(jobs))
    call_command(
        "register_topology", app="apps/window_counts.py", name="windows", stdout=StringIO()
    )
    return "windows@1"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"topology": "wordcount"}, "--topology: 'wordcount' is not a registered app"),
        (
            {"strategies": ("adaptive",)},
            "--strategies: an app's runs are cold-restart, restart-all",
        ),
        ({"faults": 0}, "--faults: an app benchmark needs 1 to 10 faults"),
        ({"args": "--in {in}"}, r"--args: must place the run's directories \{in\} and \{out\}"),
        ({"args": "--in {in} --out {out} --tmp {tmp}"}, r"--args: '\{tmp\}'"),
    ],
)
def test_the_app_benchmark_refuses_what_it_cannot_run_naming_the_option(windows, changes, message):
    from bench.app_restart.run import AppBenchSettings

    assert AppBenchSettings(topology=windows).strategies == ("cold-restart", "restart-all")
    with pytest.raises(ValueError, match=message):
        AppBenchSettings(**{"topology": windows, **changes})
