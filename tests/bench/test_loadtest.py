"""The load test: its statistics, its loopback-only rule, and a short real run."""

import pytest
from django.core.management import call_command

from bench.loadtest import (
    Sample,
    log_in,
    percentile,
    require_loopback,
    run_load,
    summarize,
)
from bench.management.commands import loadtest as command
from bench.management.commands.loadtest import console_targets
from console.roles import VIEWER
from tests.factories import EpisodeFactory, UserFactory, make_job


def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))  # 1..100
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_summary_counts_errors_and_latency_per_target():
    samples = [Sample("a", float(ms), True) for ms in range(1, 101)]
    samples += [Sample("b", 5.0, False, "503"), Sample("b", 15.0, True)]
    report = summarize(samples, duration_s=2.0)
    assert report["targets"]["a"] == {
        "requests": 100,
        "errors": 0,
        "error_kinds": {},
        "rps": 50.0,
        "p50_ms": 50.0,
        "p99_ms": 99.0,
    }
    assert report["targets"]["b"]["errors"] == 1
    assert report["targets"]["b"]["error_kinds"] == {"503": 1}
    assert report["overall"]["requests"] == 102
    assert report["overall"]["errors"] == 1


@pytest.mark.parametrize(
    "url", ["http://10.0.0.5:8000", "http://example.org", "https://127.0.0.1:8000", "ftp://::1"]
)
def test_only_loopback_http_is_accepted(url):
    with pytest.raises(ValueError):
        require_loopback(url)


@pytest.mark.parametrize(
    "url, expected",
    [
        ("http://127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("http://localhost:9", ("localhost", 9)),
        ("http://[::1]:8001", ("::1", 8001)),
    ],
)
def test_loopback_urls_are_accepted(url, expected):
    assert require_loopback(url) == expected


def test_the_password_never_reaches_the_results_file():
    argv = ["--username", "viewer", "--password", "s3cret", "--job", "1", "--password=x"]
    assert command.redact_password(argv) == [
        "--username",
        "viewer",
        "--password",
        "...",
        "--job",
        "1",
        "--password=...",
    ]


def test_write_results_replaces_only_the_load_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Results\n\n## Data plane\n\nkeep me\n\n"
        "## Load (manage.py loadtest)\n\nold\n\n## Later\n\nme too\n"
    )
    report = {
        "clients": 2,
        "duration_s": 2.0,
        "targets": {
            "job list": {
                "requests": 4,
                "rps": 2.0,
                "p50_ms": 3.0,
                "p99_ms": 9.0,
                "errors": 0,
                "error_kinds": {},
            }
        },
        "overall": {
            "requests": 4,
            "rps": 2.0,
            "p50_ms": 3.0,
            "p99_ms": 9.0,
            "errors": 2,
            "error_kinds": {"503": 2},
        },
        "job_p99_ms": {"before": None, "before_samples": 0, "during": None, "during_samples": 0},
    }
    command.write_results(report, "manage.py loadtest --clients 2", results)
    text = results.read_text()
    assert "keep me" in text and "me too" in text and "old" not in text
    assert text.count("## Load (manage.py loadtest)") == 1
    assert "| job list | 4 | 2.0 | 3.0 | 9.0 | 0 |" in text
    assert "| all | 4 | 2.0 | 3.0 | 9.0 | 2 (503: 2) |" in text
    assert ".venv/bin/python manage.py loadtest --clients 2" in text


@pytest.mark.django_db(transaction=True)
def test_a_short_run_against_the_live_server(live_server):
    UserFactory(username="loader", role=VIEWER, password="load-pw-1")
    job = make_job(status="running")
    EpisodeFactory(job=job)
    credentials = log_in(live_server.url, "loader", "load-pw-1")
    report = run_load(
        live_server.url, console_targets(job.pk, credentials), clients=2, duration_s=2.0
    )
    assert set(report["targets"]) == {
        "job list",
        "job detail",
        "recoveries",
        "metrics (job page refresh)",
    }
    for name, stats in report["targets"].items():
        assert stats["requests"] > 0, name
        assert stats["errors"] == 0, name
        assert 0 < stats["p50_ms"] <= stats["p99_ms"], name
    assert report["clients"] == 2
    assert 2.0 <= report["duration_s"] < 10


@pytest.mark.django_db(transaction=True)
def test_the_command_prints_the_table(live_server, capsys):
    UserFactory(username="loader", role=VIEWER, password="load-pw-1")
    job = make_job(status="running")
    call_command(
        "loadtest",
        "--url",
        live_server.url,
        "--username",
        "loader",
        "--password",
        "load-pw-1",
        "--job",
        str(job.pk),
        "--clients",
        "2",
        "--duration",
        "1",
    )
    out = capsys.readouterr().out
    assert "| endpoint | requests | req/s | p50 (ms) | p99 (ms) | errors |" in out
    assert "| all |" in out
    assert "Job p99 latency" in out
