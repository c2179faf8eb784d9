"""`manage.py bench`: the side-by-side strategy benchmark (bench/strategy/)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from bench.app_restart.run import (
    APP_STRATEGIES,
    AppBenchSettings,
    run_app_bench,
    to_markdown,
)
from bench.app_restart.run import write_outputs as write_app_outputs
from bench.app_restart.run import write_results as write_app_results
from bench.app_restart.workload import DEFAULT_ARGS
from bench.flink_peer.cluster import OPTIONS as FLINK_OPTIONS
from bench.flink_peer.cluster import PROFILES, RESTART_STRATEGIES, flink_settings
from bench.signals import exit_on_first_sigterm
from bench.strategy.harness import FAULT_KINDS, PEERS, REALTIME_REASON, BenchSettings
from bench.strategy.run import remeasure, run_bench, write_outputs, write_results
from bench.strategy.topics import SOURCES, TRIGGERS
from spark_runtime.jobdef import registered_app
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


# What each Flink setting option sets (bench/flink_peer/cluster.py FlinkSettings; the values of
# both profiles are added to the help).
FLINK_HELP = {
    "checkpoint_ms": "checkpoint interval, ms (execution.checkpointing.interval)",
    "heartbeat_interval_ms": "heartbeat.interval, ms",
    "heartbeat_timeout_ms": "heartbeat.timeout, ms",
    "heartbeat_rpc_failure_threshold": "heartbeat.rpc-failure-threshold (-1: off)",
    "restart_strategy": "restart-strategy.type",
    "restart_delay_ms": "restart delay, ms (restart-strategy.fixed-delay.delay, or "
    "restart-strategy.exponential-delay.initial-backoff)",
    "discovery_ms": "how often the job's FileSource looks for the bridge's new files, ms",
    "bundle_time_ms": "python.fn-execution.bundle.time, ms",
    "buffer_timeout_ms": "execution.buffer-timeout.interval, ms",
}


def flink_options(opts: dict) -> tuple[tuple[str, object], ...]:
    """The Flink settings given as options, (FlinkSettings field, value) pairs: they override
    the profile's values."""
    return tuple(
        (name, opts[f"flink_{name}"])
        for name in FLINK_OPTIONS
        if opts.get(f"flink_{name}") is not None
    )


def policy_change(item: str) -> tuple[str, str]:
    """`KEY=VALUE` of --policy as a pair (the value is checked against the field when the run
    starts); anything else is refused naming the option."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise CommandError(f"--policy: KEY=VALUE, not {item!r}")
    return key.strip(), value.strip()


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
            "--source",
            choices=SOURCES,
            default="redis",
            help="where each run's job reads its input and writes its results: redis (its own "
            "input stream and results hash) or kafka (an input and an output topic per run on "
            "a broker the benchmark starts, or on KAFKA_BOOTSTRAP_SERVERS; lost and duplicated "
            "results are counted on the output topic); default redis",
        )
        parser.add_argument(
            "--trigger",
            choices=TRIGGERS,
            default="microbatch",
            help="the jobs' trigger: microbatch (default); realtime is refused with the reason "
            "(Spark's real-time mode needs Spark's own Kafka source)",
        )
        parser.add_argument(
            "--strategies",
            default=None,
            help=f"comma-separated, from {','.join(STRATEGIES)} (default: all; --quick: "
            f"{QUICK['strategies']})",
        )
        parser.add_argument(
            "--args",
            dest="app_args",  # not `args`: BaseCommand.execute takes *args
            default=None,
            help="a registered app's arguments (--topology NAME@VERSION of an app, strategies "
            f"{','.join(APP_STRATEGIES)}); {{in}}, {{out}} and {{checkpoint}} are each run's own "
            f"directories (default: {DEFAULT_ARGS!r})",
        )
        parser.add_argument("--faults", type=int, default=None, help="faults per run, 0 to 4")
        parser.add_argument("--fault-kind", default="kill-driver", choices=FAULT_KINDS)
        parser.add_argument(
            "--outage",
            type=float,
            default=20.0,
            help="seconds a kafka-broker fault keeps the benchmark's broker stopped (default 20)",
        )
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
            "--flink-profile",
            choices=tuple(PROFILES),
            default="default",
            help="the Flink peer's settings: default (Flink's defaults and the peer's latency "
            "settings, as before issue 46) or tuned (what Flink's docs suggest for a fast "
            "recovery: checkpoints every 1 s, heartbeats 1 s / 5 s, a 500 ms fixed restart "
            "delay, 50 ms file discovery); the --flink-* options below override its values",
        )
        default, tuned = flink_settings("default"), flink_settings("tuned")
        for name, option in FLINK_OPTIONS.items():
            parser.add_argument(
                option,
                dest=f"flink_{name}",
                default=None,
                **(
                    {"choices": RESTART_STRATEGIES}
                    if name == "restart_strategy"
                    else {"type": int, "metavar": "N"}
                ),
                help=f"{FLINK_HELP[name]} (default profile: {getattr(default, name)}, "
                f"tuned: {getattr(tuned, name)})",
            )
        parser.add_argument(
            "--flink-conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="any Flink configuration key, over the profile and the options above, e.g. "
            "restart-strategy.exponential-delay.max-backoff=2s",
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
        if opts["trigger"] == "realtime":
            # Exit status 2, as for an option argparse refuses: nothing can run this.
            raise CommandError(f"--trigger realtime is refused: {REALTIME_REASON}", returncode=2)
        if registered_app(opts["topology"]) is not None:
            return self.handle_app(opts)
        if opts["app_args"] is not None:
            raise CommandError("--args: only a registered app (--topology NAME@VERSION) takes them")
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
                outage_s=opts["outage"],
                rate=opts["rate"],
                warmup_s=opts["warmup"] or quick.get("warmup", 60.0),
                duration_s=opts["duration"] or quick.get("duration", 50.0 * (faults + 1)),
                out=Path(opts["out"]),
                stable_window_s=opts["stable_window"],
                seed=opts["seed"],
                target=opts["target"],
                peer=opts["peer"],
                peer_conf=tuple(flink_conf(item) for item in opts["flink_conf"]),
                flink_profile=opts["flink_profile"],
                flink_options=flink_options(opts),
                policy=tuple(policy_change(item) for item in opts["policy"]),
                source=opts["source"],
                trigger=opts["trigger"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        command = "python manage.py " + " ".join(sys.argv[1:])
        # A SIGTERM unwinds like an error: the runs' `finally` blocks stop the job, its
        # processes, the controller and the agents (else they outlive the benchmark).
        signal.signal(signal.SIGTERM, exit_on_first_sigterm)
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

    def handle_app(self, opts) -> None:
        """An existing app restarted cold by a `spark-submit` loop and warm by Backstop, side by
        side (bench/app_restart/run.py)."""
        try:
            bench = AppBenchSettings(
                topology=opts["topology"],
                args=opts["app_args"] or DEFAULT_ARGS,
                strategies=tuple(
                    s.strip()
                    for s in (opts["strategies"] or ",".join(APP_STRATEGIES)).split(",")
                    if s.strip()
                ),
                faults=opts["faults"] if opts["faults"] is not None else 3,
                warmup_s=opts["warmup"] if opts["warmup"] is not None else 20.0,
                out=Path(opts["out"]),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        command = "python manage.py " + " ".join(sys.argv[1:])
        signal.signal(signal.SIGTERM, exit_on_first_sigterm)
        call_command("migrate", interactive=False, verbosity=0)
        try:
            result = run_app_bench(bench, say=self.stdout.write)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        result["settings"]["command"] = command
        write_app_outputs(result, bench.out)
        self.stdout.write(to_markdown(result))
        self.stdout.write(f"wrote {bench.out / 'bench.json'} and bench.md")
        if opts["write_results"]:
            self.stdout.write("wrote " + write_app_results(result, command))
