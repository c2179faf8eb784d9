"""`manage.py alert_latency`: from a condition becoming true to the receiver's request, on the
live console this checkout runs (the demo): faults into its job, alerts to a loopback
webhook (bench/alert_latency.py)."""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time

from django.core.management.base import BaseCommand, CommandError

from bench.alert_latency import AlertLatencyRun, render, summarize, when_text
from bench.results import RESULTS_MD, write_report, write_subsection
from bench.signals import exit_on_first_sigterm
from console.models import Job
from console.redis import redis_client

RESULTS_SECTION = "## Alert delivery latency (issue 61)"
RESULTS_SUBSECTION = "With the demo running (manage.py alert_latency)"


class Command(BaseCommand):
    help = (
        "Measure alert latency on the running console: set low alert thresholds (a new, "
        "audited policy version, restored at the end), route the alerts to a webhook on "
        "loopback, inject kill-driver and slow-driver into a running job with "
        "standbys, and print for each alert the seconds from its condition becoming true to "
        "the receiver's request. Needs the controller, agents and alerts worker up (the demo)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--job", help="the job's name (default: the first running job)")
        parser.add_argument("--rounds", type=int, default=5, help="rounds of the three faults")
        parser.add_argument("--out", default="var/alert-latency", help="where the JSON goes")
        parser.add_argument(
            "--write-results", action="store_true", help=f"put the figures in {RESULTS_MD.name}"
        )

    def handle(self, *args, job, rounds, out, **options):
        if not 1 <= rounds <= 50:
            raise CommandError("--rounds must be 1..50")
        running = Job.objects.filter(status=Job.Status.RUNNING).order_by("pk")
        target = (running.filter(name=job) if job else running).first()
        if target is None:
            raise CommandError(f"no running job{f' named {job!r}' if job else ''}")
        started = time.time()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        self.stdout.write(f"job {target.name} ({target.key}), {rounds} round(s)")
        # Stopped with SIGTERM, it still restores the thresholds and removes its route.
        signal.signal(signal.SIGTERM, exit_on_first_sigterm)
        run = AlertLatencyRun(target, redis_client(), rounds, self.stdout.write)
        measured = run.run()
        summary = summarize(measured)
        summary["missed"] = [{"event": event, "round": round_} for event, round_ in run.missed]
        path = write_report(
            out,
            "alert-latency.json",
            {"job": target.name, "summary": summary, "alerts": [m.__dict__ for m in measured]},
        )
        command = "python manage.py alert_latency " + shlex.join(sys.argv[2:])
        table = render(summary, command, when_text(started), load)
        self.stdout.write(table)
        self.stdout.write(f"wrote {path}")
        if options["write_results"]:
            write_subsection(RESULTS_SECTION, RESULTS_SUBSECTION, table)
