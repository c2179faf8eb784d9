"""`manage.py bench --peer flink` end to end: Backstop's adaptive strategy and Apache Flink (a
real standalone cluster from PyPI's apache-flink, in .venv-flink) on the same seeded workload
and faults, checked against the ground truth computed from the input stream.

Faults are 50 s apart: a killed TaskManager keeps Flink's output away for about 20 s here,
and each recovery must be seen before the next fault. Slow (about 9 minutes each on 2 cores,
plus the Flink install on first use): run with
`pytest -m slow tests/bench/test_bench_flink.py`. Each runs in its own process on a fresh SQLite
database and Redis db 13, like a user running the command.
"""

from pathlib import Path

import pytest

from bench.strategy.report import recovery_bound
from tests.bench.command import run_bench_command

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def run_bench(tmp_path: Path, *options: str) -> dict:
    bench = run_bench_command(
        tmp_path, "--strategies", "adaptive", "--peer", "flink", "--faults", "2",
        "--warmup", "20", "--duration", "150", *options, timeout_s=1800,
    )  # fmt: skip
    assert "Backstop vs Flink" in (tmp_path / "out" / "bench.md").read_text()
    return {run["strategy"]: run for run in bench["runs"]}


def check_exact_and_measured(runs: dict) -> None:
    assert set(runs) == {"adaptive", "flink"}
    for run in runs.values():
        # The same seeded input for both, checked against the same ground truth.
        assert run["input_events"] == 50 * 170
        assert (run["lost"], run["duplicates"], run["drained"]) == (0, 0, True)
        assert len(run["faults"]) == 2
        for fault in run["faults"]:
            assert fault["downtime_s"] is not None, fault  # the output came back
    flink = runs["flink"]
    # Flink restarted the job after each fault (its exception history has an entry per failed
    # attempt: after a killed TaskManager, deployments to it fail until it is declared lost).
    assert len(flink["peer"]["failures"]) >= 2, flink["peer"]["failures"]
    assert flink["peer"]["state_at_end"] == "RUNNING"
    # The bridge's share of the latency is measured, and is a part of it.
    assert 0 < flink["peer"]["bridge_p50_ms"] < flink["steady"]["p50_ms"]


def test_kill_driver_against_a_killed_taskmanager(tmp_path):
    runs = run_bench(tmp_path, "--fault-kind", "kill-driver")
    check_exact_and_measured(runs)
    assert [f["kind"] for f in runs["flink"]["faults"]] == ["kill-taskmanager"] * 2
    assert [f["action"] for f in runs["adaptive"]["faults"]] == ["promote", "promote"]
    adaptive, adaptive_is_bound = recovery_bound(runs["adaptive"])
    flink, _ = recovery_bound(runs["flink"])
    # Issue 17's goal: adaptive's mean recovery after a process kill at most half of Flink's.
    assert not adaptive_is_bound and adaptive <= 0.5 * flink


def test_operator_exception_against_a_task_failure(tmp_path):
    runs = run_bench(tmp_path, "--fault-kind", "operator-exception", "--topology", "topn")
    check_exact_and_measured(runs)
    assert [f["kind"] for f in runs["flink"]["faults"]] == ["task-exception"] * 2
