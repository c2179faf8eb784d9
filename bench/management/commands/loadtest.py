"""`manage.py loadtest`: 50 clients for 60 s against a console on this machine; p50/p99/errors.

The clients log in once (a session for the Dash callback, a token for the API) and then send the
job list, job detail, recoveries and the job page's metrics callback round-robin until the time
is up. With a running job, the job's own p99 latency (the controller's stored samples) in the
same length of time before the load and during it is reported beside the figures.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from bench.loadtest import Target, log_in, run_load
from bench.results import RESULTS_MD, write_section
from console.dash.job.app import REFRESH_OUTPUTS as JOB_REFRESH_OUTPUTS
from console.models import MetricSample

SECTION = "## Load (manage.py loadtest)"


class Command(BaseCommand):
    help = "Bounded load test (loopback only) of the console's job, recovery and metrics views."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="loopback only")
        parser.add_argument("--username", required=True, help="a viewer or higher")
        parser.add_argument("--password", required=True)
        parser.add_argument("--job", type=int, required=True, help="job id to read")
        parser.add_argument("--clients", type=int, default=50)
        parser.add_argument("--duration", type=float, default=60.0, help="seconds")
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--write-results", action="store_true", help=f"put the figures in {RESULTS_MD.name}"
        )

    def handle(self, *args, url, username, password, job, clients, duration, **options):
        if not 1 <= clients <= 500 or not 0 < duration <= 600:
            raise CommandError("--clients must be 1..500 and --duration 0..600 s")
        try:
            credentials = log_in(url, username, password)
            targets = console_targets(job, credentials)
            started = timezone.now()
            report = run_load(url, targets, clients=clients, duration_s=duration)
        except (ValueError, OSError) as exc:
            raise CommandError(str(exc)) from exc
        report["job_p99_ms"] = job_latency(job, started, report["duration_s"])
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write(format_report(report))
        if options["write_results"]:
            command = "manage.py loadtest " + " ".join(
                shlex.quote(arg) for arg in redact_password(sys.argv[2:])
            )
            write_results(report, command)
            self.stdout.write(f"wrote the Load section of {RESULTS_MD}")


def console_targets(job_id: int, credentials: dict[str, str]) -> list[Target]:
    """Job list, job detail, recoveries (REST API, token) and the job page's metrics callback
    (Dash, session and CSRF token)."""
    api = {"Authorization": f"Token {credentials['token']}", "Accept": "application/json"}
    # What a browser showing the job sends every 2 s: the request that reads the job's metrics.
    outputs = [{"id": name, "property": prop} for name, prop in JOB_REFRESH_OUTPUTS]
    body = {
        "output": ".." + "...".join(f"{name}.{prop}" for name, prop in JOB_REFRESH_OUTPUTS) + "..",
        "outputs": outputs,
        "inputs": [
            {"id": "refresh", "property": "n_intervals", "value": 1},
            {"id": "window", "property": "value", "value": 900},
            {"id": "url", "property": "pathname", "value": f"/console/jobs/{job_id}/"},
        ],
        "changedPropIds": ["refresh.n_intervals"],
    }
    dash = {
        "Cookie": credentials["cookie"],
        "X-CSRFToken": credentials["csrf"],
        "Content-Type": "application/json",
    }
    return [
        Target("job list", "GET", "/api/jobs/", api),
        Target("job detail", "GET", f"/api/jobs/{job_id}/", api),
        Target("recoveries", "GET", f"/api/jobs/{job_id}/recoveries/", api),
        Target(
            "metrics (job page refresh)",
            "POST",
            "/django_plotly_dash/app/backstop-job/_dash-update-component",
            dash,
            json.dumps(body).encode(),
        ),
    ]


def redact_password(argv: list[str]) -> list[str]:
    """The command line with the password replaced (it goes into a committed file)."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next:
            out.append("...")
            hide_next = False
        elif arg == "--password":
            out.append(arg)
            hide_next = True
        elif arg.startswith("--password="):
            out.append("--password=...")
        else:
            out.append(arg)
    return out


def job_latency(job_id: int, started, duration_s: float) -> dict:
    """Median of the job's stored p99 latency samples before the load and during it (ms)."""
    window = timedelta(seconds=duration_s)

    def median_between(start, end):
        values = list(
            MetricSample.objects.filter(
                job_id=job_id, stage="", name="latency_p99_ms", at__gte=start, at__lt=end
            ).values_list("value", flat=True)
        )
        return (round(statistics.median(values), 1) if values else None), len(values)

    # Samples arrive with the controller's cycle: give the last one of the window time to land.
    time.sleep(min(6.0, duration_s))
    before, before_n = median_between(started - window, started)
    during, during_n = median_between(started, started + window)
    return {
        "before": before,
        "before_samples": before_n,
        "during": during,
        "during_samples": during_n,
    }


def format_report(report: dict) -> str:
    """The figures as a Markdown table plus the job's latency line."""
    lines = [
        f"{report['clients']} clients, {report['duration_s']} s",
        "",
        "| endpoint | requests | req/s | p50 (ms) | p99 (ms) | errors |",
        "|---|---|---|---|---|---|",
    ]
    rows = [*report["targets"].items(), ("all", report["overall"])]
    for name, stats in rows:
        kinds = ", ".join(
            f"{kind}: {count}" for kind, count in sorted(stats["error_kinds"].items())
        )
        errors = f"{stats['errors']} ({kinds})" if kinds else str(stats["errors"])
        lines.append(
            f"| {name} | {stats['requests']} | {stats['rps']} | {stats['p50_ms']} | "
            f"{stats['p99_ms']} | {errors} |"
        )
    latency = report["job_p99_ms"]
    lines += [
        "",
        f"Job p99 latency (median of the controller's samples): {latency['before']} ms in the "
        f"{report['duration_s']} s before the load ({latency['before_samples']} samples), "
        f"{latency['during']} ms during it ({latency['during_samples']} samples).",
    ]
    return "\n".join(lines) + "\n"


def write_results(report: dict, command: str, path: Path = RESULTS_MD) -> None:
    """Replace (or append) the Load section of docs/RESULTS.md; other sections stay as they are."""
    body = (
        f"```bash\n.venv/bin/python {command}\n```\n\n"
        f"Measured {timezone.now():%Y-%m-%d %H:%M} UTC.\n\n{format_report(report)}"
    )
    write_section(SECTION, body, path)
