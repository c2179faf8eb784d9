"""The spare footprint benchmark's reading of a process tree (bench.dataplane.spare_footprint):
each process goes to one part, and the parts add up to the tree. The benchmark itself starts
real spares (a JVM each); its figures are in docs/RESULTS.md."""

import subprocess
import sys
import time

import psutil
import pytest

from bench.dataplane.spare_footprint import PARTS, footprint, table


@pytest.fixture
def driver_with_a_worker():
    """A Python process with one Python child, as a spare's driver and PySpark's daemon."""
    child = "import time; time.sleep(60)"
    parent = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)
    deadline = time.time() + 10
    while not psutil.Process(proc.pid).children() and time.time() < deadline:
        time.sleep(0.05)
    yield proc
    for descendant in psutil.Process(proc.pid).children(recursive=True):
        descendant.kill()
    proc.kill()
    proc.wait()


def test_each_process_counts_once_in_its_part(driver_with_a_worker):
    figures = footprint(driver_with_a_worker.pid)
    assert figures["Python driver"]["processes"] == 1
    assert figures["Python workers"]["processes"] == 1
    assert figures["JVM"] == {"rss_mb": 0.0, "pss_mb": 0.0, "processes": 0}
    root = psutil.Process(driver_with_a_worker.pid)
    rss = sum(p.memory_info().rss for p in [root, *root.children()]) / 2**20
    assert figures["total"]["rss_mb"] == pytest.approx(rss, rel=0.2)
    assert 0 < figures["total"]["pss_mb"] <= figures["total"]["rss_mb"]
    assert figures["total"]["rss_mb"] == pytest.approx(
        sum(figures[part]["rss_mb"] for part in PARTS)
    )


def test_the_table_gives_the_mean_and_every_run():
    def run(rss):
        parts = {part: {"rss_mb": rss, "pss_mb": rss / 2, "processes": 1} for part in PARTS}
        parts["total"] = {"rss_mb": 3 * rss, "pss_mb": 1.5 * rss, "processes": 3}
        return {"warm_s": 20.0, "parts": parts}

    lines = table([run(100.0), run(200.0)])
    assert "| JVM | 1 | 150 (100, 200) | 75 (50, 100) |" in lines
    assert "| total | 3 | 450 (300, 600) | 225 (150, 300) |" in lines
