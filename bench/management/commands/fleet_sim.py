"""`manage.py fleet_sim`: the real controllers supervising a simulated fleet (bench/fleet).

    manage.py fleet_sim --jobs 200 --nodes 50 --controllers 2 --duration 120 --out var/fleet
    manage.py fleet_sim --curve 10,50,100,200,500 --nodes 50 --controllers 2 --write-results
    manage.py fleet_sim --jobs 200 --nodes 50 --controllers 3 --pause-controllers 10 \
        --kill-during-upgrade 5 --duration 300

The last is the chaos run of the control plane (bench/fleet/chaos.py): controllers paused,
controllers killed in the middle of upgrades, operators' stops, rollbacks and confirms.

By default the run starts its own PostgreSQL (initdb in a temporary directory, with
pg_stat_statements, so the database's counters count the fleet's queries and nobody else's)
and its own Redis on a free port, and removes both at the end. --database-url and --redis-url
use servers that run already instead (their counters then include whatever else uses them).
Writes DIR/fleet.json, DIR/fleet.png and the controllers' logs under DIR/logs-<jobs>/.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import redis
from django.core.management.base import BaseCommand, CommandError

from bench.fleet import report
from bench.fleet.run import FleetConfig, run_curve
from bench.fleet.services import (
    KEYSPACE_EVENTS,
    PrivatePostgres,
    PrivateRedis,
    Services,
    database_url_of_default,
    django_pointed_at,
    postgres_available,
    postgres_bin_dir,
)
from bench.fleet.sim_model import SimTiming
from bench.results import RESULTS_MD, command_line

DEFAULT_CURVE = "10,50,100,200,500"


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise CommandError(f"--curve: comma-separated job counts, not {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise CommandError("--curve: job counts of 1 or more")
    return sizes


SHOWN_OPTIONS = (
    "jobs", "nodes", "controllers", "pause_controllers", "kill_during_upgrade", "duration",
    "out", "seed", "curve",
)  # fmt: skip


def ensure_keyspace_events(url: str) -> None:
    """The simulated stages hear their commands through keyspace events for lists: turn them on
    in a Redis this run did not start (adding to what is on)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    current = client.config_get("notify-keyspace-events").get("notify-keyspace-events", "")
    wanted = "".join(sorted(set(current) | set(KEYSPACE_EVENTS)))
    if set(KEYSPACE_EVENTS) - set(current):
        client.config_set("notify-keyspace-events", wanted)


class Command(BaseCommand):
    help = "Run the real controllers against a simulated fleet of jobs and nodes; measure them."

    def add_arguments(self, parser):
        parser.add_argument("--jobs", type=int, default=10)
        parser.add_argument("--nodes", type=int, default=5)
        parser.add_argument("--controllers", type=int, default=2)
        parser.add_argument("--duration", type=float, default=60.0, help="measured seconds")
        parser.add_argument("--out", default="var/fleet", help="where fleet.json goes")
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument(
            "--curve",
            nargs="?",
            const=DEFAULT_CURVE,
            default="",
            help=f"job counts to run one after another instead of --jobs (alone: {DEFAULT_CURVE})",
        )
        parser.add_argument(
            "--write-results", action="store_true", help=f"update {RESULTS_MD.name}: Fleet scale"
        )
        parser.add_argument(
            "--database-url", default="", help="default: a PostgreSQL of the run's own"
        )
        parser.add_argument("--redis-url", default="", help="default: a Redis of the run's own")
        parser.add_argument(
            "--kill-every", type=float, default=2.0, help="seconds between process kills"
        )
        parser.add_argument("--node-kills", type=int, default=None)
        parser.add_argument("--node-down", type=float, default=20.0, help="seconds")
        parser.add_argument("--no-controller-kill", action="store_true")
        parser.add_argument(
            "--controller-restart-after",
            type=float,
            default=None,
            help="start the killed controller again after this many seconds (default: never; "
            "at once in a chaos run)",
        )
        parser.add_argument("--controller-concurrency", type=int, default=8)
        parser.add_argument("--page-requests", type=int, default=20)
        parser.add_argument("--warmup-timeout", type=float, default=300.0)
        parser.add_argument("--cold-start", type=float, default=SimTiming.cold_start_s)
        parser.add_argument(
            "--pause-controllers",
            type=int,
            default=0,
            help="pause a random controller (SIGSTOP) for 2-10 s this many times",
        )
        parser.add_argument(
            "--kill-during-upgrade",
            type=int,
            default=0,
            help="upgrade this many jobs and SIGKILL each one's controller in the middle",
        )
        parser.add_argument(
            "--upgrade-validation",
            type=float,
            default=FleetConfig.upgrade_validation_s,
            help="the policy's upgrade validation window for those upgrades (seconds)",
        )
        parser.add_argument(
            "--chaos-settle",
            type=float,
            default=FleetConfig.chaos_settle_s,
            help="seconds to wait after the window for the chaos run's requests to take effect",
        )

    def handle(self, *args, **options):
        sizes = parse_sizes(options["curve"]) if options["curve"] else [options["jobs"]]
        try:
            base = FleetConfig(
                jobs=sizes[-1],
                nodes=options["nodes"],
                controllers=options["controllers"],
                duration_s=options["duration"],
                seed=options["seed"],
                kill_every_s=options["kill_every"],
                node_kills=options["node_kills"],
                node_down_s=options["node_down"],
                controller_kill=not options["no_controller_kill"],
                controller_restart_after_s=options["controller_restart_after"],
                controller_concurrency=options["controller_concurrency"],
                warmup_timeout_s=options["warmup_timeout"],
                page_requests=options["page_requests"],
                timing=SimTiming(cold_start_s=options["cold_start"]),
                pause_controllers=options["pause_controllers"],
                kill_during_upgrade=options["kill_during_upgrade"],
                upgrade_validation_s=options["upgrade_validation"],
                chaos_settle_s=options["chaos_settle"],
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        out = Path(options["out"]).resolve()
        out.mkdir(parents=True, exist_ok=True)
        command = command_line("fleet_sim", options, SHOWN_OPTIONS)
        say = self._say
        with contextlib.ExitStack() as stack:
            redis_url, private_redis = options["redis_url"], False
            if not redis_url:
                server = PrivateRedis(out / "redis")
                server.start()
                stack.callback(server.stop)
                redis_url, private_redis = server.url, True
                say(f"[fleet] Redis of the run's own at {redis_url}")
            else:
                ensure_keyspace_events(redis_url)
            database_url, private_db = options["database_url"], False
            if not database_url:
                why_not = postgres_available()
                if why_not is None:
                    pg = PrivatePostgres(postgres_bin_dir())
                    stack.callback(pg.destroy)
                    pg.create()
                    database_url, private_db = pg.url, True
                    counted = "yes" if pg.statements else "no"
                    say(f"[fleet] PostgreSQL of the run's own on port {pg.port} "
                        f"(pg_stat_statements: {counted}); migrating")  # fmt: skip
                else:
                    database_url = database_url_of_default()
                    say(f"[fleet] no PostgreSQL of its own ({why_not}): using {database_url}")
            services = Services(redis_url, database_url, private_db, private_redis)
            stack.enter_context(
                django_pointed_at(services, use_database=database_url != database_url_of_default())
            )
            results = run_curve(base, sizes, services, out, say)
        path = report.write_json(out, results, command)
        plot = report.plot(out, results)
        say(f"[fleet] wrote {path} and {plot}")
        if options["write_results"]:
            report.write_results(results, command)
            say(f"[fleet] wrote the Fleet scale section of {RESULTS_MD}")
        self.stdout.write(report.table(results) + "\n")
        misses = report.goal_misses(max(results, key=lambda r: r["jobs"]))
        self.stdout.write(
            "goals: all met\n" if not misses else "goals missed: " + "; ".join(misses) + "\n"
        )

    def _say(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()
