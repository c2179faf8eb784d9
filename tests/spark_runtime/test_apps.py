"""Registering an existing app (spark_runtime/apps.py): the check that runs without starting
its queries, the path rules, the snapshot a job runs, the bounds of its arguments, and the
checkpoint a query without one gets (spark_runtime/app_stage.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spark_runtime import apps
from spark_runtime.app_stage import query_checkpoint_name
from spark_runtime.jobdef import registered_app, registered_path, resolve_topology
from spark_runtime.topology import compile_stages
from tests.app_files import write_input

GOOD_APP = """\
import argparse

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.builder.getOrCreate()
"""


@pytest.fixture
def jobs(tmp_path) -> Path:
    (tmp_path / "apps").mkdir()
    return tmp_path


def write(jobs: Path, name: str, text: str) -> str:
    (jobs / "apps" / name).write_text(text)
    return f"apps/{name}"


def test_an_app_that_compiles_and_imports_passes(jobs):
    path = write(jobs, "good.py", GOOD_APP)
    assert apps.check_app(path, jobs) == {"errors": [], "path": "apps/good.py"}


def test_a_syntax_error_is_refused_naming_its_line(jobs):
    path = write(jobs, "broken.py", GOOD_APP + "\nspark.readStream(\n")
    [error] = apps.check_app(path, jobs)["errors"]
    assert error.startswith("apps/broken.py line 8: SyntaxError")


def test_imports_that_fail_are_refused_each_naming_its_line(jobs):
    text = GOOD_APP + (
        "import json\n"
        "import no_such_module_here\n"
        "from pyspark.sql import no_such_name\n"
        "def later():\n"
        "    from .sibling import helper\n"
        "try:\n"
        "    import optional_thing_missing\n"
        "except ImportError:\n"
        "    optional_thing_missing = None\n"
    )
    errors = apps.check_app(write(jobs, "imports.py", text), jobs)["errors"]
    assert errors == [
        "apps/imports.py line 8: ModuleNotFoundError: No module named 'no_such_module_here'",
        "apps/imports.py line 9: ImportError: cannot import name 'no_such_name' from 'pyspark.sql'",
        "apps/imports.py line 11: a relative import: an app is one file (it may import "
        "installed packages only)",
    ]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../outside.py", "outside the jobs directory"),
        ("/etc/passwd", "outside the jobs directory"),
        ("apps/missing.py", "no such file"),
        ("apps/notes.txt", "expected a Python file"),
        (".registered/x/v1.py", "registered snapshots cannot be registered again"),
        ("", "a path inside the jobs directory is required"),
    ],
)
def test_paths_outside_the_rules_are_refused(jobs, path, message):
    (jobs / "apps" / "notes.txt").write_text("x")
    (jobs / ".registered" / "x").mkdir(parents=True)
    (jobs / ".registered" / "x" / "v1.py").write_text(GOOD_APP)
    (jobs.parent / "outside.py").write_text(GOOD_APP)
    [error] = apps.check_app(path, jobs)["errors"]
    assert message in error


def test_the_check_runs_as_a_command_and_exits_1_on_errors(jobs):
    path = write(jobs, "bad.py", "import no_such_module_here\n")
    done = subprocess.run(
        [sys.executable, "-m", "spark_runtime.apps", "check", path, "--jobs-dir", str(jobs)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert json.loads(done.stdout)["errors"] == [
        "apps/bad.py line 1: ModuleNotFoundError: No module named 'no_such_module_here'"
    ]


def test_a_snapshot_runs_as_one_stage_of_one_operator(jobs):
    path = write(jobs, "good.py", GOOD_APP)
    snapshot = registered_path("counts", 3, jobs)
    snapshot.parent.mkdir(parents=True)
    snapshot.write_text(apps.snapshot_text(path, jobs))
    app = registered_app("counts@3", jobs)
    assert app == apps.AppDefinition("counts", "apps/good.py", GOOD_APP)
    topology = resolve_topology("counts@3", jobs)
    assert topology.name == "counts@3" and topology.job == app
    [stage] = compile_stages(topology, "fused")
    assert (stage.name, stage.operators) == ("job", ("app",))
    # Built-in topologies and missing versions are no apps.
    assert registered_app("wordcount", jobs) is None
    assert registered_app("counts@4", jobs) is None


def test_arguments_are_bounded_naming_the_field():
    assert apps.validate_args(None) == []
    assert apps.validate_args(["--in", "/data"]) == ["--in", "/data"]
    with pytest.raises(apps.AppError, match=r"^args: must be a list of strings"):
        apps.validate_args(["--n", 3])
    with pytest.raises(apps.AppError, match=r"^args: at most 64 arguments, got 65"):
        apps.validate_args(["x"] * 65)
    with pytest.raises(apps.AppError, match=r"^args\[1\]: at most 1024 characters"):
        apps.validate_args(["ok", "x" * 1025])


def test_a_query_checkpoint_is_named_after_the_query_else_its_place():
    assert query_checkpoint_name("totals", 1) == "query-totals"
    assert query_checkpoint_name("a b/c", 2) == "query-a_b_c"
    assert query_checkpoint_name(None, 2) == "query-2"


def test_the_local_runner_records_an_apps_arguments(redis_url, redis_conn, job, tmp_path, jobs):
    from spark_runtime import keys
    from spark_runtime.__main__ import main

    with pytest.raises(SystemExit):
        main(["run", "--topology", "wordcount", "--job", job, "--redis-url", redis_url]
             + ["--arg=x"] * 65)  # fmt: skip
    assert redis_conn.get(keys.app_args(job)) is None
    arguments = ["--in", str(tmp_path / "in"), "--out", str(tmp_path / "out")]
    # A run of no time: the replica is started and stopped at once, its arguments stay.
    main(["run", "--topology", "wordcount", "--job", job, "--redis-url", redis_url,
          "--duration", "0", *(f"--arg={a}" for a in arguments)])  # fmt: skip
    assert json.loads(redis_conn.get(keys.app_args(job))) == arguments


def test_input_files_arrive_in_the_order_they_are_written(tmp_path):
    # A file source takes files by modification time, ties in listing order: files written in
    # a loop must not share one, or an event-time app drops a later-listed earlier file as late.
    source = tmp_path / "in"
    for index in range(8):
        write_input(source, index, [{"n": index}])
    times = [(source / f"part-{i:03d}.json").stat().st_mtime_ns // 1_000_000 for i in range(8)]
    assert all(earlier < later for earlier, later in zip(times, times[1:], strict=False))
