"""density.json's rows built from recorded episodes, audits and standbys (bench/density/report.py),
and the command's option checks."""

import json

import pytest

from bench.density.report import (
    EpisodeFigures,
    cores_by_kind,
    density_run,
    spread,
    to_markdown,
)
from bench.density.run import DensitySettings, parse_job_counts

RUN_KEYS = {"jobs", "cpu_cores", "steady_p50_ms", "recovery_s", "reprotect_s", "lost",
            "duplicates", "standbys_kept", "standbys_wanted"}  # fmt: skip


def episode(action, recovery, reprotect=None, **phases):
    return EpisodeFigures("j", "count", action, recovery, reprotect, phases)


def test_a_row_has_the_interface_keys_and_its_percentiles_from_the_episodes():
    episodes = [
        episode("promote", 1.5, 20.0, detection=1.0),
        episode("promote", 3.0, None, detection=2.0),
        episode("restart-stage", 40.0, None, detection=3.0),
        episode("restart-stage", None, None),
    ]
    audits = [{"lost": 0, "duplicates": 2}, {"lost": 1, "duplicates": 0}, {"lost": None}]
    row = density_run(jobs=3, cpu_cores=1.234, steady_p50_ms=812.34, episodes=episodes,
                      audits=audits, standbys=(2, 3), faults=[])  # fmt: skip
    assert set(row) >= RUN_KEYS
    assert row["recovery_s"] == {"p50": 3.0, "p99": 40.0, "count": 3}
    # Re-protect times are those of promotions; one is still missing.
    assert row["reprotect_s"] == {"p50": 20.0, "p99": 20.0, "count": 1}
    assert (row["unrecovered"], row["not_reprotected"]) == (1, 1)
    assert (row["lost"], row["duplicates"], row["audited_jobs"]) == (1, 2, 2)
    assert (row["standbys_kept"], row["standbys_wanted"]) == (2, 3)
    assert (row["cpu_cores"], row["steady_p50_ms"]) == (1.23, 812.3)
    assert row["phases_p50_s"]["detection"] == 2.0
    assert row["phases_p50_s"]["state restore"] is None
    json.dumps(row)


def test_nothing_measured_gives_empty_spreads_and_no_audit():
    assert spread([None, None]) == {"p50": None, "p99": None, "count": 0}
    row = density_run(jobs=1, cpu_cores=None, steady_p50_ms=None, episodes=[], audits=[],
                      standbys=(0, 1), faults=[])  # fmt: skip
    assert row["lost"] is None and row["duplicates"] is None
    assert row["recovery_s"]["count"] == 0


def test_the_markdown_has_one_line_per_job_count():
    row = density_run(jobs=2, cpu_cores=1.5, steady_p50_ms=700.0,
                      episodes=[episode("promote", 2.0, 30.0)], audits=[{"lost": 0,
                      "duplicates": 0}], standbys=(2, 2), faults=[])  # fmt: skip
    report = {"command": "python manage.py density --jobs 2", "date": "2026-11-29",
              "machine": "2 cores", "rate": 20.0, "faults": 1, "runs": [row]}  # fmt: skip
    text = to_markdown(report)
    assert "| 2 | 1.5 | 700 | 2 / 2 [1] | 30 / 30 [1] | 0 | 0 | 2 / 2 |" in text


def test_cores_per_kind_sum_each_process_over_the_window_and_show_in_the_markdown():
    before = {10: 5.0, 11: 1.0, 12: 0.5, 13: 2.0}
    after = {10: 8.0, 11: 2.0, 12: 1.5, 13: 2.2}  # 14 started during the window: not counted
    kinds = {10: "primary", 11: "standby", 12: "primary"}  # 13 is no kind the soak knows
    cores = cores_by_kind(before, after, kinds, seconds=10.0)
    assert cores == {"primary": 0.4, "standby": 0.1, "other": 0.02}
    assert list(cores) == ["primary", "standby", "other"]  # largest first
    row = density_run(jobs=1, cpu_cores=0.52, cpu_by_kind=cores, steady_p50_ms=400.0,
                      episodes=[], audits=[], standbys=(1, 1), faults=[])  # fmt: skip
    report = {"command": "c", "date": "d", "machine": "m", "rate": 20.0, "faults": 0,
              "runs": [row, {**row, "jobs": 2, "cpu_by_kind": {"primary": 0.8}}]}  # fmt: skip
    text = to_markdown(report)
    assert "| jobs | other | primary | standby |" in text
    assert "| 1 | 0.02 | 0.4 | 0.1 |" in text
    assert "| 2 | - | 0.8 | - |" in text


def test_launches_the_reserve_refused_are_counted_apart_and_named():
    why = "density-6-5-1: could not launch: refused: host h: cpu 12% free (measured) vs 20%"
    row = density_run(jobs=6, cpu_cores=1.7, steady_p50_ms=900.0, episodes=[], audits=[],
                      standbys=(5, 5), faults=[], refused=[why])  # fmt: skip
    assert (row["jobs"], row["jobs_running"], row["refused"]) == (6, 5, [why])
    report = {"command": "c", "date": "d", "machine": "m", "rate": 20.0, "faults": 0,
              "runs": [row]}  # fmt: skip
    assert "| 6 (1 refused) | 1.7 | 900 |" in to_markdown(report)
    alone = density_run(jobs=1, cpu_cores=0.3, steady_p50_ms=400.0, episodes=[], audits=[],
                        standbys=(1, 1), faults=[])  # fmt: skip
    assert (alone["jobs_running"], alone["refused"]) == (1, [])


def test_options_are_checked_naming_the_option():
    assert parse_job_counts("1,2, 4") == (1, 2, 4)
    with pytest.raises(ValueError, match="--jobs"):
        parse_job_counts("1,two")
    with pytest.raises(ValueError, match="--rate"):
        DensitySettings(job_counts=(1,), rate=0, faults=1, out="x")
    with pytest.raises(ValueError, match="--jobs"):
        DensitySettings(job_counts=(0,), rate=20, faults=1, out="x")
