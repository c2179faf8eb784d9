"""`manage.py density`: 1, 2, 4, 6, ... protected jobs at once under the adaptive policy, with
kill-driver faults into them in turn, measured per job count (bench/density/)."""

from __future__ import annotations

import json
import shlex
import signal
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from bench.density.report import to_markdown
from bench.density.run import Density, DensitySettings, parse_job_counts
from bench.results import RESULTS_MD, write_section
from bench.signals import exit_on_first_sigterm
from bench.soak.run import add_policy_argument, parse_policy

RESULTS_SECTION = "## Density (manage.py density)"


class Command(BaseCommand):
    help = (
        "For each job count of --jobs, run that many jobs (wordcount and topn in turn, adaptive, "
        "--rate lines/s each) at once, measure CPU, steady p50 and standbys, inject --faults "
        "kill-driver faults into them in turn, audit their output, and write DIR/density.json. "
        "Starts its own Redis, controller, beat and node agents, and stops them at the end."
    )

    def add_arguments(self, parser):
        parser.add_argument("--jobs", default="1,2,4,6", help="job counts, e.g. 1,2,4,6")
        parser.add_argument("--rate", type=float, default=20.0, help="input lines/s of each job")
        parser.add_argument("--faults", type=int, default=3, help="kill-driver faults per count")
        parser.add_argument("--out", default="var/density", help="where density.json goes")
        parser.add_argument("--steady", type=float, default=60.0, help="steady window, seconds")
        parser.add_argument(
            "--episode-timeout", type=float, default=300.0,
            help="seconds a fault's recovery may take before it is given up on",
        )  # fmt: skip
        parser.add_argument(
            "--reprotect-timeout", type=float, default=180.0,
            help="seconds after the last fault for promotions to get their standby back",
        )  # fmt: skip
        parser.add_argument("--seed", type=int, default=7)
        add_policy_argument(parser)
        parser.add_argument(
            "--report", default="", help="write the RESULTS.md section from this density.json"
        )
        parser.add_argument(
            "--write-results",
            action="store_true",
            help=f"also write the '{RESULTS_SECTION[3:]}' section of {RESULTS_MD.name}",
        )

    def handle(self, *args, **opts):
        if opts["report"]:
            report = json.loads(Path(opts["report"]).read_text())
            write_section(RESULTS_SECTION, to_markdown(report))
            self._say(f"[density] wrote the density section of {RESULTS_MD}")
            return
        try:
            settings = DensitySettings(
                job_counts=parse_job_counts(opts["jobs"]),
                rate=opts["rate"],
                faults=opts["faults"],
                out=Path(opts["out"]).resolve(),
                steady_s=opts["steady"],
                episode_timeout_s=opts["episode_timeout"],
                reprotect_timeout_s=opts["reprotect_timeout"],
                seed=opts["seed"],
                policy=parse_policy(opts["policy"]),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        command = "python manage.py density " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        signal.signal(signal.SIGTERM, exit_on_first_sigterm)
        try:
            report = Density(settings, self._say, command).run()
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            raise CommandError(f"interrupted; partial {settings.out / 'density.json'}") from None
        self._say(f"[density] wrote {settings.out / 'density.json'}")
        if opts["write_results"]:
            write_section(RESULTS_SECTION, to_markdown(report))
            self._say(f"[density] wrote the density section of {RESULTS_MD}")

    def _say(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()
