"""`manage.py soak`: three jobs for M minutes under a seeded schedule of faults and control-plane
restarts, on a cluster of the run's own (bench/soak/)."""

from __future__ import annotations

import json
import shlex
import signal
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from bench.results import RESULTS_MD, write_report, write_section
from bench.signals import exit_on_first_sigterm
from bench.soak.report import to_markdown
from bench.soak.run import (
    Soak,
    SoakSettings,
    add_policy_argument,
    parse_policy,
    soak_report_figures,
)
from bench.soak.schedule import parse_spacing

RESULTS_SECTION = "## Soak (manage.py soak)"


class Command(BaseCommand):
    help = (
        "Run wordcount and topn (adaptive) and the example user job (local-restart) for "
        "--minutes under a seeded schedule of every fault kind and restarts of the controller, "
        "a node agent, Redis and PostgreSQL; audit the outputs, sample resources, and write "
        "DIR/soak.json. Starts its own Redis, PostgreSQL (when installed), controller, beat "
        "and three node agents, and stops them at the end."
    )

    def add_arguments(self, parser):
        parser.add_argument("--minutes", type=float, default=60.0)
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--out", default="var/soak", help="where soak.json goes")
        parser.add_argument(
            "--spacing", default="60,120", help="LOW,HIGH seconds between events (default 60,120)"
        )
        parser.add_argument("--rate", type=float, default=20.0, help="input lines/s of each job")
        parser.add_argument("--audit-every", type=float, default=300.0, help="seconds")
        parser.add_argument("--sample-every", type=float, default=60.0, help="seconds")
        parser.add_argument(
            "--kafka",
            action="store_true",
            help="run wordcount on Kafka topics (a broker of the run's own unless "
            "KAFKA_BOOTSTRAP_SERVERS is set) and add kafka-broker to the fault mix",
        )
        parser.add_argument(
            "--settle",
            type=float,
            default=240.0,
            help="seconds after the schedule for its last events to be judged",
        )
        parser.add_argument(
            "--report",
            default="",
            help="write the RESULTS.md section from this finished run's soak.json (no run)",
        )
        add_policy_argument(parser)
        parser.add_argument(
            "--write-results",
            action="store_true",
            help=f"also write the '{RESULTS_SECTION[3:]}' section of {RESULTS_MD.name}",
        )

    def handle(self, *args, **opts):
        if opts["report"]:
            # A finished run's report, judged again from what it recorded (so that a run is
            # judged on the goals as they stand) and written into RESULTS.md.
            path = Path(opts["report"])
            report = json.loads(path.read_text())
            report.update(
                soak_report_figures(
                    report, report["faults"], report["audits"], report["samples"],
                    report["minutes"] * 60,
                )
            )  # fmt: skip
            write_report(path.parent, path.name, report)
            self._say_goals(report)
            write_section(RESULTS_SECTION, to_markdown(report))
            self._say(f"[soak] wrote the soak section of {RESULTS_MD} from {path}")
            return
        try:
            settings = SoakSettings(
                minutes=opts["minutes"],
                seed=opts["seed"],
                out=Path(opts["out"]).resolve(),
                spacing_s=parse_spacing(opts["spacing"]),
                rate=opts["rate"],
                audit_every_s=opts["audit_every"],
                sample_every_s=opts["sample_every"],
                settle_s=opts["settle"],
                kafka=opts["kafka"],
                policy=parse_policy(opts["policy"]),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        command = "python manage.py soak " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        signal.signal(signal.SIGTERM, exit_on_first_sigterm)
        try:
            report = Soak(settings, self._say, command).run()
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            # The run stopped what it started and wrote what it had measured.
            raise CommandError(f"interrupted; partial {settings.out / 'soak.json'}") from None
        self._say(f"[soak] wrote {settings.out / 'soak.json'}")
        self._say_goals(report)
        if opts["write_results"]:
            write_section(RESULTS_SECTION, to_markdown(report))
            self._say(f"[soak] wrote the soak section of {RESULTS_MD}")

    def _say_goals(self, report: dict) -> None:
        for name, goal in report["goals"].items():
            met = {True: "met", False: "MISSED", None: "not judged"}[goal["met"]]
            self._say(f"[soak] goal {name}: {met} ({goal['detail']})")

    def _say(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()
