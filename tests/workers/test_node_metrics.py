"""Node sampling with psutil against real processes."""

import subprocess
import sys
import time

import pytest

from workers.node_metrics import HOST, PROCESSES, Capacity, NodeSampler, node_processes

CAPACITY = Capacity(cpu_total=2.0, mem_total_mb=4096.0, disk_max_mbps=100.0, bw_total_mbps=1000.0)


@pytest.fixture
def busy_stage():
    """A process that looks like a stage of node 'tn-1' to the sampler and burns one core."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "while True: pass", "spark_runtime.stage", "--node", "tn-1"]
    )
    yield proc
    proc.kill()
    proc.wait()


def test_processes_scope_counts_only_the_nodes_processes(busy_stage):
    assert [p.pid for p in node_processes("tn-1")] == [busy_stage.pid]
    assert node_processes("tn-2") == []
    sampler = NodeSampler("tn-1", CAPACITY, scope=PROCESSES)
    sampler.sample()  # first call primes psutil's CPU counters
    time.sleep(1.0)
    usage = sampler.sample()
    assert usage.processes == 1
    # A busy loop uses up to one core; on a loaded machine it may get much less, never none.
    assert 0.02 < usage.cpu_used <= 1.1
    assert 0 < usage.mem_used < 200
    other = NodeSampler("tn-2", CAPACITY, scope=PROCESSES)
    other.sample()
    time.sleep(0.2)
    assert other.sample().cpu_used == 0.0


def test_host_scope_reports_the_machine():
    sampler = NodeSampler("host", CAPACITY, scope=HOST)
    time.sleep(0.2)
    usage = sampler.sample()
    assert usage.cpu_total == 2.0 and usage.mem_total == 4096.0
    assert usage.mem_used > 0
    assert usage.bw_total == 1000.0


def test_unknown_scope_is_refused():
    with pytest.raises(ValueError, match="scope"):
        NodeSampler("x", CAPACITY, scope="galaxy")


def test_a_renamed_warm_spare_reads_as_the_stage_it_became():
    """A spare renames itself with setproctitle: Linux shows one NUL-padded string, which
    argv_of splits back, so every scanner finds the replica by its flags."""
    import subprocess
    import sys
    import time

    import psutil

    from workers.node_metrics import argv_of, cmdline_arg

    title = f"{sys.executable} -m spark_runtime.stage --job j1 --replica-id count-2 --node n-1"
    code = f"import setproctitle, time; setproctitle.setproctitle({title!r}); time.sleep(5)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 5
        while time.time() < deadline:
            argv = argv_of(psutil.Process(proc.pid).cmdline())
            if "spark_runtime.stage" in argv:
                break
            time.sleep(0.1)
        assert cmdline_arg(argv, "--replica-id") == "count-2"
        assert cmdline_arg(argv, "--node") == "n-1"
    finally:
        proc.kill()
        proc.wait()
    # An ordinary command line is left as it is.
    assert argv_of(["python", "-m", "x", "--a b"]) == ["python", "-m", "x", "--a b"]
    assert argv_of(None) == []


def test_spare_processes_are_the_spares_not_yet_running_a_replica():
    """What the benchmark reports as the spares' cost: a spare process counts until it takes
    a replica's command line, then it is one of that job's stage processes instead."""
    import psutil

    from workers.node_metrics import argv_of, spare_processes, stage_processes

    sleep = "import time; time.sleep(30)"
    idle = subprocess.Popen(
        [sys.executable, "-c", sleep, "-m", "spark_runtime.spare", "--node", "tn-1",
         "--spare-id", "spare-tn-1-a"]
    )  # fmt: skip
    title = (
        f"{sys.executable} -m spark_runtime.stage --job j-idle-test --replica-id c-1 --node tn-1"
    )
    became = f"import setproctitle, time; setproctitle.setproctitle({title!r}); time.sleep(30)"
    taken = subprocess.Popen(
        [sys.executable, "-c", became, "-m", "spark_runtime.spare", "--node", "tn-1",
         "--spare-id", "spare-tn-1-b"]
    )  # fmt: skip
    try:
        deadline = time.time() + 10
        while "spark_runtime.stage" not in argv_of(psutil.Process(taken.pid).cmdline()):
            assert time.time() < deadline, "the taken spare never took the stage's title"
            time.sleep(0.1)
        # Other spares may run on this machine (other tests' agents): look for these two only.
        spare_pids = {p.pid for p in spare_processes()}
        assert idle.pid in spare_pids
        assert taken.pid not in spare_pids
        assert [p.pid for p in stage_processes(job="j-idle-test")] == [taken.pid]
    finally:
        for proc in (idle, taken):
            proc.kill()
            proc.wait()
    assert {idle.pid, taken.pid}.isdisjoint(p.pid for p in spare_processes())
