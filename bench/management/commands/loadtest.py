"""`manage.py loadtest`: viewers of one job against a console on this machine; p50/p99/errors,
the server's CPU, and the job's own latency before and during the load.

The clients log in once (a session for the Dash callback, a token for the API). Each then acts
like a browser with the job page open beside a script polling the API: every `--pace` seconds
(the page's 2 s refresh) it sends the job list, job detail, recoveries and the job page's
refresh callback (`--page-only`: the page's refresh alone, a browser watching the job);
`--pace 0` sends them back to back instead (a closed loop: what the server answers at most).
`--clients 1,10,50` runs each count in turn for `--duration` seconds. The server's CPU is read
from the processes listening on the URL's port (gunicorn's master and workers), and the job's
own p99 latency (the controller's stored samples) in the same length of time before the first
run and during each run.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from bench.loadtest import Target, cpu_seconds, log_in, run_load, server_processes
from bench.results import RESULTS_MD, write_section
from console.dash.job.app import REFRESH_OUTPUTS as JOB_REFRESH_OUTPUTS
from console.dash.sharing import DATA_AGE
from console.models import MetricSample

SECTION = "## Load (manage.py loadtest)"
DASH_TARGET = "metrics (job page refresh)"
# Issue 45's goals for 50 clients.
GOALS = {"api_p99_ms": 300.0, "dash_p99_ms": 1000.0, "job_p99_growth": 0.10, "cpu_ratio": 2.0}


def client_counts(raw: str) -> list[int]:
    """`10,50` as [10, 50]; each count 1..500."""
    try:
        counts = [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise CommandError(f"--clients: expected numbers such as 10,50, got {raw!r}") from None
    if not counts or not all(1 <= count <= 500 for count in counts):
        raise CommandError("--clients: each count must be 1..500")
    return counts


class Command(BaseCommand):
    help = "Bounded load test (loopback only) of the console's job, recovery and metrics views."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="loopback only")
        parser.add_argument("--username", required=True, help="a viewer or higher")
        parser.add_argument("--password", required=True)
        parser.add_argument("--job", type=int, required=True, help="job id to read")
        parser.add_argument(
            "--clients", default="50", help="client counts, run in turn (e.g. 1,10,50)"
        )
        parser.add_argument("--duration", type=float, default=60.0, help="seconds per run")
        parser.add_argument(
            "--pace",
            type=float,
            default=2.0,
            help="seconds between a client's rounds (the page's refresh); 0: closed loop",
        )
        parser.add_argument(
            "--page-only",
            action="store_true",
            help="clients send only the job page's refresh (browsers watching the job)",
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--write-results", action="store_true", help=f"put the figures in {RESULTS_MD.name}"
        )

    def handle(self, *args, url, username, password, job, duration, pace, **options):
        counts = client_counts(options["clients"])
        if not 0 < duration <= 600 or not 0 <= pace <= 60:
            raise CommandError("--duration must be 0..600 s and --pace 0..60 s")
        try:
            credentials = log_in(url, username, password)
            targets = console_targets(job, credentials)
            if options["page_only"]:
                targets = [t for t in targets if t.name == DASH_TARGET]
            port = urlsplit(url).port or 80
            server = server_processes(port)
        except (ValueError, OSError) as exc:
            raise CommandError(str(exc)) from exc
        report = {
            "url": url,
            "pace_s": pace,
            "targets": [t.name for t in targets],
            "server_processes": len(server),
            "runs": [],
        }
        windows = []
        for number, clients in enumerate(counts, 1):
            self.stderr.write(
                f"[loadtest {number}/{len(counts)}] {clients} clients for {duration:g} s"
            )
            started = timezone.now()
            cpu_before = cpu_seconds(server)
            run = run_load(url, targets, clients=clients, duration_s=duration, pace_s=pace)
            run["server_cores"] = round((cpu_seconds(server) - cpu_before) / run["duration_s"], 3)
            report["runs"].append(run)
            windows.append((started, started + timedelta(seconds=run["duration_s"])))
        # The controller stores samples each cycle: give the last window's ones time to land.
        time.sleep(min(6.0, duration))
        for run, (start, end) in zip(report["runs"], windows, strict=True):
            run["job_p99_ms_during"] = job_latency(job, start, end)
        first_start, first_end = windows[0]
        report["job_p99_ms_before"] = job_latency(job, first_start - (first_end - first_start),
                                                  first_start)  # fmt: skip
        report["goals"] = judge(report)
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
    refresh_outputs = [*JOB_REFRESH_OUTPUTS, DATA_AGE]
    outputs = [{"id": name, "property": prop} for name, prop in refresh_outputs]
    body = {
        "output": ".." + "...".join(f"{name}.{prop}" for name, prop in refresh_outputs) + "..",
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
            DASH_TARGET,
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


def job_latency(job_id: int, start, end) -> dict:
    """Median of the job's stored p99 latency samples between `start` and `end` (ms)."""
    values = list(
        MetricSample.objects.filter(
            job_id=job_id, stage="", name="latency_p99_ms", at__gte=start, at__lt=end
        ).values_list("value", flat=True)
    )
    return {
        "median": round(statistics.median(values), 1) if values else None,
        "samples": len(values),
    }


def _api_p99(run: dict) -> float | None:
    values = [s["p99_ms"] for name, s in run["targets"].items() if name != DASH_TARGET]
    return max((v for v in values if v is not None), default=None)


def judge(report: dict) -> dict:
    """Issue 45's goals against the largest run (and the CPU of the largest against the
    smallest): each with its figure, its bound and whether it holds."""
    runs = sorted(report["runs"], key=lambda run: run["clients"])
    largest, smallest = runs[-1], runs[0]
    before = report["job_p99_ms_before"]["median"]
    during = largest["job_p99_ms_during"]["median"]
    growth = (during / before - 1) if before and during is not None else None
    cpu_ratio = (
        largest["server_cores"] / smallest["server_cores"]
        if len(runs) > 1 and smallest["server_cores"] > 0
        else None
    )
    figures = {
        "api_p99_ms": (_api_p99(largest), GOALS["api_p99_ms"]),
        "dash_p99_ms": (
            largest["targets"].get(DASH_TARGET, {}).get("p99_ms"),
            GOALS["dash_p99_ms"],
        ),
        "errors": (largest["overall"]["errors"], 0),
        "job_p99_growth": (None if growth is None else round(growth, 3), GOALS["job_p99_growth"]),
        "cpu_ratio": (None if cpu_ratio is None else round(cpu_ratio, 2), GOALS["cpu_ratio"]),
    }
    return {
        # None: not measured in this run (e.g. no API request with --page-only).
        name: {"value": value, "bound": bound, "met": None if value is None else value <= bound}
        for name, (value, bound) in figures.items()
    } | {"clients": largest["clients"], "cpu_ratio_against_clients": smallest["clients"]}


def format_report(report: dict) -> str:
    """Each run as a Markdown table, the job's latency and the server's CPU, then the goals."""
    mode = f"every {report['pace_s']:g} s" if report["pace_s"] > 0 else "closed loop"
    before = report["job_p99_ms_before"]
    lines = [
        f"Each client sends its round ({', '.join(report['targets'])}) {mode}; server: "
        f"{report['server_processes']} processes on {report['url']}.",
        "",
        f"Job p99 latency before the load (median of the controller's samples): "
        f"{before['median']} ms ({before['samples']} samples).",
    ]
    for run in report["runs"]:
        during = run["job_p99_ms_during"]
        lines += [
            "",
            f"{run['clients']} clients, {run['duration_s']} s: server CPU "
            f"{run['server_cores']} cores; job p99 latency during the load "
            f"{during['median']} ms ({during['samples']} samples)",
            "",
            "| endpoint | requests | req/s | p50 (ms) | p99 (ms) | errors |",
            "|---|---|---|---|---|---|",
        ]
        for name, stats in [*run["targets"].items(), ("all", run["overall"])]:
            kinds = ", ".join(
                f"{kind}: {count}" for kind, count in sorted(stats["error_kinds"].items())
            )
            errors = f"{stats['errors']} ({kinds})" if kinds else str(stats["errors"])
            lines.append(
                f"| {name} | {stats['requests']} | {stats['rps']} | {stats['p50_ms']} | "
                f"{stats['p99_ms']} | {errors} |"
            )
    goals = report["goals"]
    lines += ["", f"Goals at {goals['clients']} clients:", ""]
    for name in ("api_p99_ms", "dash_p99_ms", "errors", "job_p99_growth", "cpu_ratio"):
        goal = goals[name]
        against = (
            f" (against {goals['cpu_ratio_against_clients']} client(s))"
            if name == "cpu_ratio"
            else ""
        )
        verdict = {True: "met", False: "MISSED", None: "not measured"}[goal["met"]]
        lines.append(f"- {name}: {goal['value']} (bound {goal['bound']}){against}: {verdict}")
    return "\n".join(lines) + "\n"


def write_results(report: dict, command: str, path: Path = RESULTS_MD) -> None:
    """Replace (or append) the Load section of docs/RESULTS.md; other sections stay as they are."""
    body = (
        f"```bash\n.venv/bin/python {command}\n```\n\n"
        f"Measured {timezone.now():%Y-%m-%d %H:%M} UTC.\n\n{format_report(report)}"
    )
    write_section(SECTION, body, path)
