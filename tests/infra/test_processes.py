"""Process discovery (infra.processes) against real child processes with recognisable command
lines: each test starts its own, with ids of its own, and kills them in the end. Other
processes of the same kinds may run on this machine (other tests' agents, a demo), so the tests
look only for their own pids."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import psutil
import pytest

from infra.processes import (
    CPU_HOG_MODULE,
    SPARE_MODULE,
    STAGE_MODULE,
    argv_of,
    cmdline_arg,
    cpu_hogs,
    job_processes,
    node_processes,
    processes_matching,
    processes_with_env,
    spare_processes,
    stage_processes,
)
from tests.conftest import wait_until

SLEEP = "import time; time.sleep(30)"


@pytest.fixture
def spawn():
    """`spawn(*args, code=SLEEP, env=None)` starts `python -c code *args` and returns it once its
    command line shows `args` (at once with `shown=False`: `code` retitles the process);
    every process started is killed afterwards."""
    started: list[subprocess.Popen] = []

    def _spawn(
        *args: str, code: str = SLEEP, env: dict | None = None, shown: bool = True
    ) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env)
        started.append(proc)
        if shown:
            wait_until(
                lambda: argv_of(psutil.Process(proc.pid).cmdline())[-len(args) :] == list(args),
                10,
                f"pid {proc.pid} to show {args}",
            )
        return proc

    try:
        yield _spawn
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


@pytest.fixture
def tag() -> str:
    """An id no other process on this machine uses."""
    return uuid.uuid4().hex[:8]


def pids(procs) -> set[int]:
    return {p.pid for p in procs}


def test_argv_of_splits_a_retitled_command_line_and_keeps_an_ordinary_one():
    assert argv_of(["python -m spark_runtime.stage --job j1", "", ""]) == [
        "python", "-m", "spark_runtime.stage", "--job", "j1",
    ]  # fmt: skip
    assert argv_of(["python", "-m", "x", "--a b"]) == ["python", "-m", "x", "--a b"]
    assert argv_of(None) == []
    assert argv_of([]) == []


def test_cmdline_arg_is_the_value_after_its_flag():
    argv = ["python", "-m", STAGE_MODULE, "--job", "j1", "--node"]
    assert cmdline_arg(argv, "--job") == "j1"
    assert cmdline_arg(argv, "--replica-id") is None
    assert cmdline_arg(argv, "--node") is None  # the flag ends the line: no value


def test_processes_matching_finds_a_child_by_its_command_line(spawn, tag):
    mine = spawn("--job", f"job-{tag}")
    other = spawn("--job", f"other-{tag}")
    found = processes_matching(lambda argv: cmdline_arg(argv, "--job") == f"job-{tag}")
    assert pids(found) == {mine.pid}
    assert other.pid not in pids(found)
    # The scan's command line stays on the process for the caller to read.
    assert cmdline_arg(argv_of(found[0].info["cmdline"]), "--job") == f"job-{tag}"


def test_processes_matching_leaves_zombies_out(tag):
    """A child that exited but was not waited for is a zombie: not a live process."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(0.3)", "--job", f"zombie-{tag}"]
    )
    try:
        wait_until(
            lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE,
            10,
            "the child to exit",
        )
        assert processes_matching(lambda argv: True) != []
        assert proc.pid not in pids(processes_matching(lambda argv: True))
    finally:
        proc.kill()
        proc.wait()


def test_a_renamed_warm_spare_reads_as_the_stage_it_became(spawn, tag):
    """A spare that takes a replica renames itself with setproctitle: Linux shows one NUL-padded
    string, which argv_of splits back, so every scanner finds the replica by its flags."""
    title = f"{sys.executable} -m {STAGE_MODULE} --job j-{tag} --replica-id count-2 --node n-{tag}"
    code = f"import setproctitle, time; setproctitle.setproctitle({title!r}); time.sleep(30)"
    proc = spawn("-m", SPARE_MODULE, "--spare-id", f"spare-{tag}", code=code, shown=False)
    argv = wait_until(
        lambda: (a := argv_of(psutil.Process(proc.pid).cmdline())) and STAGE_MODULE in a and a,
        10,
        "the spare to take the stage's title",
    )
    assert cmdline_arg(argv, "--replica-id") == "count-2"
    assert cmdline_arg(argv, "--node") == f"n-{tag}"
    # It is now one of the job's stage processes, no longer a spare.
    assert pids(stage_processes(job=f"j-{tag}")) == {proc.pid}
    assert proc.pid not in pids(spare_processes())


def test_stage_processes_filter_by_node_and_job(spawn, tag):
    a = spawn("-m", STAGE_MODULE, "--job", f"ja-{tag}", "--node", f"n1-{tag}")
    b = spawn("-m", STAGE_MODULE, "--job", f"jb-{tag}", "--node", f"n1-{tag}")
    c = spawn("-m", STAGE_MODULE, "--job", f"ja-{tag}", "--node", f"n2-{tag}")
    spare = spawn("-m", SPARE_MODULE, "--node", f"n1-{tag}", "--spare-id", f"s-{tag}")
    # Neither a stage nor a spare, though it names the job and the node.
    spawn("-m", "something.else", "--job", f"ja-{tag}", "--node", f"n1-{tag}")
    assert pids(stage_processes(node=f"n1-{tag}")) == {a.pid, b.pid, spare.pid}
    assert pids(stage_processes(job=f"ja-{tag}")) == {a.pid, c.pid}
    assert pids(stage_processes(node=f"n1-{tag}", job=f"ja-{tag}")) == {a.pid}
    assert {a.pid, b.pid, c.pid, spare.pid} <= pids(stage_processes())


def test_spare_processes_filter_by_redis_url(spawn, tag):
    url = f"redis://127.0.0.1:6379/{tag}"
    mine = spawn("-m", SPARE_MODULE, "--spare-id", f"s1-{tag}", "--redis-url", url)
    theirs = spawn("-m", SPARE_MODULE, "--spare-id", f"s2-{tag}", "--redis-url", url + "x")
    assert pids(spare_processes(redis_url=url)) == {mine.pid}
    assert {mine.pid, theirs.pid} <= pids(spare_processes())


def test_job_processes_are_any_data_plane_process_of_the_jobs(spawn, tag):
    stage = spawn("-m", STAGE_MODULE, "--job", f"j1-{tag}", "--replica-id", "count-1")
    generator = spawn("-m", "spark_runtime", "generate", "--job", f"j2-{tag}")
    other_job = spawn("-m", STAGE_MODULE, "--job", f"j3-{tag}")
    not_data_plane = spawn("-m", "workers.agent", "--job", f"j1-{tag}")
    found = pids(job_processes({f"j1-{tag}", f"j2-{tag}"}))
    assert found == {stage.pid, generator.pid}
    assert {other_job.pid, not_data_plane.pid}.isdisjoint(found)


def test_node_processes_are_its_stages_and_cpu_hogs_with_their_children(spawn, tag):
    node = f"n-{tag}"
    # A stage that starts a child of its own, as a stage's driver starts its JVM.
    parent_code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)', 'jvm']); "
        "time.sleep(30)"
    )
    stage = spawn("-m", STAGE_MODULE, "--node", node, code=parent_code)
    jvm = wait_until(lambda: psutil.Process(stage.pid).children(), 10, "the stage's child")[0]
    hog = spawn("-m", CPU_HOG_MODULE, "10", node)
    other_hog = spawn("-m", CPU_HOG_MODULE, "10", f"other-{tag}")
    try:
        assert pids(cpu_hogs(node)) == {hog.pid}
        assert pids(node_processes(node)) == {stage.pid, jvm.pid, hog.pid}
        assert other_hog.pid not in pids(node_processes(node))
    finally:
        jvm.kill()


def test_processes_with_env_find_children_by_an_environment_variable(spawn, tag):
    marked = spawn("--marked", env={**os.environ, "BACKSTOP_TEST_MARK": tag})
    unmarked = spawn("--unmarked")
    found = pids(processes_with_env("BACKSTOP_TEST_MARK", tag))
    assert found == {marked.pid}
    assert unmarked.pid not in found
    assert os.getpid() not in pids(processes_with_env("PATH", os.environ["PATH"]))
