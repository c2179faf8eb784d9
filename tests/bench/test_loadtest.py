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


def _run(clients: int, cores: float, api_p99: float, dash_p99: float, job_p99: float) -> dict:
    def stats(p99, errors=0):
        return {"requests": 4, "rps": 2.0, "p50_ms": 3.0, "p99_ms": p99, "errors": errors,
                "error_kinds": {"503": errors} if errors else {}}  # fmt: skip

    return {
        "clients": clients,
        "duration_s": 2.0,
        "pace_s": 2.0,
        "server_cores": cores,
        "targets": {"job list": stats(api_p99), command.DASH_TARGET: stats(dash_p99)},
        "overall": stats(max(api_p99, dash_p99)),
        "job_p99_ms_during": {"median": job_p99, "samples": 3},
    }


def _report(*runs) -> dict:
    report = {
        "url": "http://127.0.0.1:8000",
        "pace_s": 2.0,
        "server_processes": 4,
        "targets": ["job list", command.DASH_TARGET],
        "runs": list(runs),
        "job_p99_ms_before": {"median": 1000.0, "samples": 30},
    }
    report["goals"] = command.judge(report)
    return report


def test_goals_are_judged_on_the_largest_run_against_the_smallest():
    goals = _report(_run(1, 0.10, 20.0, 80.0, 990.0), _run(50, 0.18, 250.0, 900.0, 1090.0))["goals"]
    assert goals["clients"] == 50 and goals["cpu_ratio_against_clients"] == 1
    assert goals["api_p99_ms"] == {"value": 250.0, "bound": 300.0, "met": True}
    assert goals["dash_p99_ms"]["met"] and goals["errors"]["met"]
    assert goals["cpu_ratio"] == {"value": 1.8, "bound": 2.0, "met": True}
    assert goals["job_p99_growth"] == {"value": 0.09, "bound": 0.1, "met": True}
    missed = _report(_run(1, 0.10, 20.0, 80.0, 990.0), _run(50, 0.30, 350.0, 900.0, 1200.0))
    assert not missed["goals"]["api_p99_ms"]["met"]
    assert missed["goals"]["cpu_ratio"]["value"] == 3.0 and not missed["goals"]["cpu_ratio"]["met"]
    assert not missed["goals"]["job_p99_growth"]["met"]


def test_write_results_replaces_only_the_load_section(tmp_path):
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Results\n\n## Data plane\n\nkeep me\n\n"
        "## Load (manage.py loadtest)\n\nold\n\n## Later\n\nme too\n"
    )
    report = _report(_run(10, 0.1, 9.0, 9.0, 1000.0))
    command.write_results(report, "manage.py loadtest --clients 10", results)
    text = results.read_text()
    assert "keep me" in text and "me too" in text and "old" not in text
    assert text.count("## Load (manage.py loadtest)") == 1
    assert "| job list | 4 | 2.0 | 3.0 | 9.0 | 0 |" in text
    assert "10 clients, 2.0 s: server CPU 0.1 cores" in text
    assert ".venv/bin/python manage.py loadtest --clients 10" in text


@pytest.mark.django_db(transaction=True)
def test_a_short_run_against_the_live_server(live_server):
    UserFactory(username="loader", role=VIEWER, password="load-pw-1")
    job = make_job(status="running")
    EpisodeFactory(job=job)
    credentials = log_in(live_server.url, "loader", "load-pw-1")
    report = run_load(
        live_server.url, console_targets(job.pk, credentials), clients=2, duration_s=2.0
    )
    assert set(report["targets"]) == {"job list", "job detail", "recoveries", command.DASH_TARGET}
    for name, stats in report["targets"].items():
        assert stats["requests"] > 0, name
        assert stats["errors"] == 0, name
        assert 0 < stats["p50_ms"] <= stats["p99_ms"], name
    assert report["clients"] == 2
    assert 2.0 <= report["duration_s"] < 10


@pytest.mark.django_db(transaction=True)
def test_paced_clients_send_one_round_per_interval(live_server):
    UserFactory(username="loader", role=VIEWER, password="load-pw-1")
    job = make_job(status="running")
    credentials = log_in(live_server.url, "loader", "load-pw-1")
    # 2 clients, a round every 1 s for 2.25 s, phases 0 and 0.5 s: the first starts rounds at
    # 0, 1 and 2 s, the second at 0.5 and 1.5 s (2.5 s is past the end): 5 rounds, one request
    # per target each.
    report = run_load(
        live_server.url,
        console_targets(job.pk, credentials),
        clients=2,
        duration_s=2.25,
        pace_s=1.0,
    )
    for name, stats in report["targets"].items():
        assert stats["requests"] == 5, name
        assert stats["errors"] == 0, name
    assert report["pace_s"] == 1.0


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
        "1,2",
        "--duration",
        "1",
        "--pace",
        "0.5",
    )
    out = capsys.readouterr().out
    assert out.count("| endpoint | requests | req/s | p50 (ms) | p99 (ms) | errors |") == 2
    assert "| all |" in out
    assert "Job p99 latency before the load" in out
    assert "1 clients, " in out and "2 clients, " in out and "server CPU" in out
    assert "Goals at 2 clients:" in out and "cpu_ratio" in out
