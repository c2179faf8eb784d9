"""`manage.py bench`: the side-by-side strategy benchmark (bench/strategy/)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from bench.strategy.harness import FAULT_KINDS, PEERS, BenchSettings
from bench.strategy.run import remeasure, run_bench, write_outputs, write_results
from spark_runtime.strategies import STRATEGIES

# Small enough for a few minutes on 2 cores: the baseline and the adaptive strategy, one fault.
# Two faults 30 s apart: the second one finds adaptive's re-seeded standby.
QUICK = {"strategies": "restart-all,adaptive", "faults": 2, "warmup": 20.0, "duration": 90.0}


def flink_conf(item: str) -> tuple[str, str]:
    """`KEY=VALUE` of --flink-conf as a pair; anything else is refused naming the option."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise CommandError(f"--flink-conf: KEY=VALUE, not {item!r}")
    return key.strip(), value.strip()


def policy_change(item: str) -> tuple[str, str]:
    """`KEY=VALUE` of --policy as a pair (the value is checked against the field when the run
    starts); anything else is refused naming the option."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise CommandError(f"--policy: KEY=VALUE, not {item!r}")
    return key.strip(), value.strip()


def _exit_on_sigterm(*_args) -> None:
    """Unwind on the first SIGTERM; a second one during the clean-up must not cut it short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(1)


class Command(BaseCommand):
    help = (
        "Run each strategy on the same seeded workload and fault schedule, one after another, "
        "and write DIR/bench.json, bench.md and bench.png. Starts Redis (if none answers), the "
        "controller, beat and three node agents itself; stop the demo first."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--topology",
            default="wordcount",
            help="wordcount, topn, or a registered job with a reference function (docs/JOBS.md)",
        )
        parser.add_argument(
            "--strategies",
            default=None,
            help=f"comma-separated, from {','.join(STRATEGIES)} (default: all; --quick: "
            f"{QUICK['strategies']})",
        )
        parser.add_argument("--faults", type=int, default=None, help="faults per run, 0 to 4")
        parser.add_argument("--fault-kind", default="kill-driver", choices=FAULT_KINDS)
        parser.add_argument(
            "--rate", type=float, default=50.0, help="input events per second (default: the demo's)"
        )
        parser.add_argument(
            "--warmup",
            type=float,
            default=None,
            help="seconds of input before measuring (default 60: the split jobs' first batches "
            "work off a start-up backlog; --quick: 20)",
        )
        parser.add_argument(
            "--duration",
            type=float,
            default=None,
            help="measured seconds after the warm-up; faults at duration*i/(faults+1) "
            "(default: 50 s per fault interval)",
        )
        parser.add_argument(
            "--stable-window",
            type=float,
            default=10.0,
            help="seconds back in band that count as recovered",
        )
        parser.add_argument("--target", default=None, help="operator to fault (default: key)")
        parser.add_argument(
            "--peer",
            choices=PEERS,
            default=None,
            help="also run the workload and faults on this stream processor (flink: a standalone "
            "Apache Flink cluster from PyPI's apache-flink, installed into .venv-flink on first "
            "use; docs/RESULTS.md 'Backstop vs Flink')",
        )
        parser.add_argument(
            "--flink-conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="Flink configuration beyond the peer's defaults, e.g. heartbeat.timeout=5000",
        )
        parser.add_argument(
            "--policy",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a policy setting for the runs, e.g. warm_spares_per_node=0 (a new policy "
            "version, audited; the version in force before is put back afterwards)",
        )
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--out", default="var/bench", help="output directory")
        parser.add_argument("--quick", action="store_true", help="a run of a few minutes")
        parser.add_argument(
            "--remeasure",
            metavar="DIR",
            default=None,
            help="recompute DIR/bench.json's figures from the progress its jobs left in Redis "
            "(no new run)",
        )
        parser.add_argument(
            "--write-results",
            action="store_true",
            help="also put the tables, the command and the machine into docs/RESULTS.md",
        )

    def handle(self, *args, **opts):
        quick = QUICK if opts["quick"] else {}
        faults = opts["faults"] if opts["faults"] is not None else quick.get("faults", 4)
        try:
            bench = BenchSettings(
                topology=opts["topology"],
                strategies=tuple(
                    s.strip()
                    for s in (
                        opts["strategies"] or quick.get("strategies") or ",".join(STRATEGIES)
                    ).split(",")
                    if s.strip()
                ),
                faults=faults,
                fault_kind=opts["fault_kind"],
                rate=opts["rate"],
                warmup_s=opts["warmup"] or quick.get("warmup", 60.0),
                duration_s=opts["duration"] or quick.get("duration", 50.0 * (faults + 1)),
                out=Path(opts["out"]),
                stable_window_s=opts["stable_window"],
                seed=opts["seed"],
                target=opts["target"],
                peer=opts["peer"],
                peer_conf=tuple(flink_conf(item) for item in opts["flink_conf"]),
                policy=tuple(policy_change(item) for item in opts["policy"]),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        command = "python manage.py " + " ".join(sys.argv[1:])
        # A SIGTERM unwinds like an error: the runs' `finally` blocks stop the job, its
        # processes, the controller and the agents (else they outlive the benchmark).
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        call_command("migrate", interactive=False, verbosity=0)
        if opts["remeasure"]:
            out = Path(opts["remeasure"])
            result = remeasure(json.loads((out / "bench.json").read_text()))
        else:
            out = bench.out
            try:
                result = run_bench(bench, say=self.stdout.write)
            except RuntimeError as exc:
                raise CommandError(str(exc)) from None
            result["settings"]["command"] = command
        write_outputs(result, out)
        self.stdout.write(f"wrote {out / 'bench.json'}, bench.md and bench.png")
        if opts["write_results"]:
            self.stdout.write(
                "wrote " + write_results(result, result["settings"].get("command", command))
            )
