"""`manage.py bench_upgrade`: a blue/green upgrade against stop-and-restart (bench/upgrade/)."""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from bench.signals import exit_on_first_sigterm
from bench.upgrade.run import (
    ROLLBACKS,
    UpgradeBenchSettings,
    run_upgrade_bench,
    write,
    write_results,
)
from console.models import RegisteredTopology
from spark_runtime.topology import TOPOLOGIES


class Command(BaseCommand):
    help = (
        "Run a job of --topology NAME@V under adaptive and upgrade it blue/green to --to "
        "NAME@W after the warm-up, then do the stop-and-restart upgrade of a second job as the "
        "baseline; "
        "write DIR/upgrade.json (output gap, lost and duplicated results of each). Starts its "
        "own controller, beat and node agents (and Redis if none answers)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--topology", required=True, help="the running version, NAME@V (or a built-in NAME)"
        )
        parser.add_argument(
            "--to", required=True, help="the version to upgrade to, NAME@W (or the built-in NAME)"
        )
        parser.add_argument(
            "--param",
            action="append",
            default=[],
            metavar="OP.KEY=VALUE",
            help="an operator parameter of the new version (repeatable; a built-in's upgrade)",
        )
        parser.add_argument("--rate", type=float, default=50.0, help="input events/s")
        parser.add_argument("--out", default="var/bench/upgrade", help="where upgrade.json goes")
        parser.add_argument("--warmup", type=float, default=40.0, help="seconds before measuring")
        parser.add_argument(
            "--duration",
            type=float,
            default=150.0,
            help="measured seconds after the warm-up (the check, the switch and after)",
        )
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument(
            "--result-preserving",
            action="store_true",
            help="declare the blue/green upgrade result-preserving: the old version checks the "
            "new one's results while validating",
        )
        parser.add_argument(
            "--rollback",
            choices=ROLLBACKS,
            default="",
            help="roll the blue/green upgrade back 15 s after its switch: its new version "
            "killed (crash), an operator's rollback (by-hand), or its batches slowed until the "
            "validation rolls it back for latency (latency); rollback_gap_s is the output gap "
            "there",
        )
        parser.add_argument(
            "--write-results", action="store_true", help="put the table into docs/RESULTS.md"
        )

    def handle(self, *args, **opts):
        signal.signal(signal.SIGTERM, exit_on_first_sigterm)
        call_command("migrate", interactive=False, verbosity=0)
        for ref in (opts["topology"], opts["to"]):
            name, _, version = ref.partition("@")
            if ref in TOPOLOGIES:
                continue
            if (
                not version.isdigit()
                or not RegisteredTopology.objects.filter(name=name, version=int(version)).exists()
            ):
                raise CommandError(
                    f"{ref}: not a built-in topology ({', '.join(sorted(TOPOLOGIES))}) nor a "
                    "registered version NAME@V (register the module first: manage.py "
                    "register_topology package.module:attribute)"
                )
        params = {}
        for item in opts["param"]:
            name, sep, value = item.partition("=")
            if not sep or "." not in name:
                raise CommandError(f"--param: {item!r} is not OP.KEY=VALUE")
            params[name] = value
        if opts["topology"].partition("@")[0] != opts["to"].partition("@")[0]:
            raise CommandError("--to: a version of the same topology as --topology")
        try:
            settings = UpgradeBenchSettings(
                topology=opts["topology"],
                to=opts["to"],
                to_params=params,
                rate=opts["rate"],
                warmup_s=opts["warmup"],
                duration_s=opts["duration"],
                out=Path(opts["out"]),
                seed=opts["seed"],
                result_preserving=opts["result_preserving"],
                rollback=opts["rollback"],
            )
            settings.workload()  # checks the workload's settings
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        command = "python manage.py bench_upgrade " + shlex.join(sys.argv[2:])
        result = run_upgrade_bench(settings, self.stdout.write)
        result["command"] = command
        write(result, settings.out)
        self.stdout.write(f"wrote {settings.out / 'upgrade.json'}")
        if opts["write_results"]:
            self.stdout.write(f"wrote {write_results(result, command)}")
