"""`manage.py page_timing` (bench/page_timing.py) at a tiny size: every page answered and timed,
the seeded fleet as large as asked, and nothing left in the configured database."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from bench.pages import page_requests
from console.models import Job, MetricSample, Node

NODE_SERIES = 10  # usage, idle rates, Q and warm spares per node sample
JOB_SERIES = 3  # throughput, p50 and p99 per live job sample


@pytest.mark.django_db
def test_every_page_is_timed_on_a_seeded_fleet_of_its_own(tmp_path):
    jobs, nodes, minutes, step = 4, 2, 1, 5
    call_command(
        "page_timing", "--jobs", str(jobs), "--nodes", str(nodes), "--minutes", str(minutes),
        "--step", str(step), "--requests", "1", "--out", str(tmp_path),
    )  # fmt: skip
    report = json.loads((tmp_path / "page-timing.json").read_text())
    pages = set(page_requests("any"))
    assert set(report["p95_ms"]) == pages and not report["errors"]
    for key in ("p50_ms", "p95_ms", "max_ms", "bytes"):
        assert all(report[key][page] > 0 for page in pages), (key, report[key])
    assert all(report["p50_ms"][p] <= report["p95_ms"][p] <= report["max_ms"][p] for p in pages)
    # Every seeded job is live at these indexes (none is the 7th or 13th of 20).
    steps = minutes * 60 // step
    assert report["metric_samples"] == jobs * steps * JOB_SERIES + nodes * steps * NODE_SERIES
    assert (report["jobs"], report["live_jobs"], report["nodes"]) == (jobs, jobs, nodes)
    assert report["requests"] == 1
    assert report["command"] == (  # called from code: the options, not pytest's argv
        f"manage.py page_timing --jobs 4 --nodes 2 --minutes 1.0 --step 5 --requests 1 "
        f"--out {tmp_path}"
    )
    # The fleet went into a database of the run's own, not into the configured one.
    assert not Job.objects.exists() and not Node.objects.exists()
    assert not MetricSample.objects.exists()
    if connection.vendor == "postgresql":  # and that database was dropped
        with connection.cursor() as cursor:
            cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", ["%_bench_%"])
            assert cursor.fetchall() == []


def test_bad_sizes_are_refused_naming_the_option(tmp_path):
    with pytest.raises(CommandError, match="--nodes: at least 2"):
        call_command("page_timing", "--nodes", "1", "--out", str(tmp_path))
    with pytest.raises(CommandError, match="--minutes: more than 0"):
        call_command("page_timing", "--minutes", "0", "--out", str(tmp_path))
