"""`manage.py page_timing`: every console page and API endpoint timed at fleet size, on a seeded
fleet in a database and a Redis of the run's own (bench/page_timing.py says how).

    manage.py page_timing                      # 200 jobs, 50 nodes, 16 min of 1 s samples
    manage.py page_timing --jobs 500 --nodes 100 --out var/pages --write-results

`manage.py fleet_sim` times four of the same pages (bench/pages.py, the one timing of both) on
what its simulated run left; this command times all of them on a fleet of a chosen size and
history without running anything.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from bench.alert_latency import when_text
from bench.fleet.services import METRICS_TOKEN, PrivateRedis, Services, django_pointed_at
from bench.page_timing import PageTimingSettings, render, run
from bench.results import RESULTS_MD, command_line, write_report, write_section
from bench.scratch import ScratchDatabaseError, scratch_database

RESULTS_SECTION = "## Pages at fleet size (manage.py page_timing)"


class Command(BaseCommand):
    help = (
        "Seed a fleet (--jobs on --nodes with --minutes of samples every --step seconds) into "
        "a database of the run's own on the configured server, time every console page and "
        "API endpoint --requests times as a viewer, write DIR/page-timing.json and print p50, "
        "p95 and max. The database is dropped and the run's own Redis stopped at the end."
    )

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=int, default=200)
        parser.add_argument("--nodes", type=int, default=50)
        parser.add_argument("--minutes", type=float, default=16.0, help="history of samples")
        parser.add_argument("--step", type=int, default=1, help="seconds between samples")
        parser.add_argument("--requests", type=int, default=20, help="timed requests per page")
        parser.add_argument("--out", default="var/page-timing", help="where the JSON goes")
        parser.add_argument(
            "--redis-url",
            default="",
            help="a Redis for the pages' shared data (default: one of the run's own; never the "
            "Redis a live console reads, whose viewers would see the seeded fleet)",
        )
        parser.add_argument(
            "--write-results", action="store_true", help=f"put the table in {RESULTS_MD.name}"
        )

    def handle(self, *args, **options):
        try:
            settings = PageTimingSettings(
                jobs=options["jobs"],
                nodes=options["nodes"],
                minutes=options["minutes"],
                step_s=options["step"],
                requests=options["requests"],
            )
        except ValueError as exc:
            raise CommandError(f"--{exc}") from None
        started = time.time()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        command = command_line(
            "page_timing",
            options,
            ("jobs", "nodes", "minutes", "step", "requests", "out", "redis_url"),
        )
        with contextlib.ExitStack() as stack:
            redis_url = options["redis_url"]
            if not redis_url:
                server = PrivateRedis(Path(options["out"]).resolve() / "redis")
                server.start()
                stack.callback(server.stop)
                redis_url = server.url
                self._say(f"Redis of the run's own at {redis_url}")
            stack.enter_context(django_pointed_at(Services(redis_url, ""), use_database=False))
            try:
                stack.enter_context(scratch_database(self._say))
            except ScratchDatabaseError as exc:
                raise CommandError(str(exc)) from None
            report = run(settings, METRICS_TOKEN, self._say)
        report["command"] = command
        path = write_report(options["out"], "page-timing.json", report)
        table = render(report, command, when_text(started), load)
        self.stdout.write(table)
        self._say(f"wrote {path}")
        if options["write_results"]:
            write_section(RESULTS_SECTION, table)
            self._say(f"wrote the '{RESULTS_SECTION[3:]}' section of {RESULTS_MD}")

    def _say(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()
