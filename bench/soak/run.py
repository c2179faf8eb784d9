"""`manage.py soak`: three jobs under a seeded schedule of faults and control-plane restarts on a
cluster of the run's own, measured as it goes.

Services: a redis-server of the run's own with append-only persistence (infra/redis_server.py),
which the run crashes and starts again; a PostgreSQL of the run's own (bench/fleet/services.py)
when the machine has its binaries, else the database this process uses (PostgreSQL restarts are
then skipped, and the report says so); the controller, beat and three node agents through
infra.launcher.LocalCluster, in a ProcessGroup that starts again whatever exits (so a controller
or agent the schedule kills comes back as it would under a process manager).

Jobs: wordcount and topn under adaptive, the example user job (examples.clickstream:activity,
registered as the demo registers it) under local-restart, all at `rate` lines/s. With `kafka`,
wordcount reads and writes Kafka topics of the run's own, on a broker the run starts in its
ProcessGroup and keeps (infra/kafka_outage.py; `KAFKA_BOOTSTRAP_SERVERS`, when set, names a
cluster the run does not own, where kafka-broker faults are refused and reported so), and the
schedule deals `kafka-broker` too.

Every event of the schedule (bench/soak/schedule.py) is measured until it is judged:
- a fault of a job (through console.services.faults.request_fault, as an operator asks for one):
  by the recovery episodes the console records for it (recovered when every one closed with a
  recovery time); a fault that opens no episode (kill-standby, stress-node, a short pause) by its
  output: the first batch the job's final stage wrote after the fault (kill-standby: and a
  standby of that stage running again; kafka-broker: after the broker answered again);
- a restart of the controller, Redis or PostgreSQL: the time from when the service was back (the
  kill, for the controller: its restart is part of what is measured) until every job's policy
  cycle ran again (`controller_cycle`, written at the end of each cycle, every 5 s, by the lease
  holder: supervision resumed, database and Redis used);
- a restart of a node agent: the time until the agent's heartbeat comes again.

Every `audit_every_s` and at the end each job's output so far is audited against the plain-Python
reference of its input (console.services.recovery.audit_output, the console's audit of a running
job: console/policy/truth.py). Every `sample_every_s` the processes of the run (its servers, the
cluster's processes, and every process started with `--redis-url` or an environment naming the
run's Redis: stages, spares, generators, their JVMs and Python workers) are classified
(bench/soak/processes.py) and their RSS and descriptors summed per kind; the database's rows per
table, Redis's memory and keys and the checkpoint directory's bytes are read too. At the end the
jobs are stopped, housekeeping (console.services.retention.purge_old_records) runs, and what is
left of them (processes, Redis keys) is reported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psutil
import redis
from confluent_kafka import KafkaException
from django.conf import settings as django_settings
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import DatabaseError, close_old_connections, connection, connections
from django.utils import timezone

from bench.fleet.services import (
    PrivatePostgres,
    Services,
    database_url_of_default,
    django_pointed_at,
    postgres_available,
    postgres_bin_dir,
    worker_env,
)
from bench.results import write_report
from bench.soak import processes as soak_processes
from bench.soak import report as soak_report
from bench.soak.faults import LIVE_REPLICA_STATES, FaultPlay, Pending, soak_user
from bench.soak.schedule import (
    DEFAULT_SPACING_S,
    Event,
    event_kinds,
    plan_schedule,
)
from bench.strategy.run import machine_description
from console.models import Job, Policy, Replica
from console.redis import redis_client
from console.services.demo_setup import DEMO_NODES, ensure_demo_nodes
from console.services.jobs import create_job, kill_job_processes, kill_warm_spares, stop_job
from console.services.policy import PolicyRejected, change_policy
from console.services.recovery import audit_output
from console.services.retention import purge_old_records
from console.services.schedules import ensure_periodic_tasks
from console.services.topologies import RegistrationRefused
from console.services.topologies import register as register_topology
from infra.launcher import LocalCluster, start_kafka_if_needed, wait_for
from infra.process_group import ProcessGroup
from infra.processes import argv_of, cmdline_arg, safe_read
from infra.redis_server import PrivateRedis
from spark_runtime import keys as data_keys

USER_JOB = "examples.clickstream:activity"  # as `manage.py demo` registers it
# (name, topology, strategy) of the three jobs.
JOBS = (
    ("soak-wordcount", "wordcount", Job.Strategy.ADAPTIVE),
    ("soak-topn", "topn", Job.Strategy.ADAPTIVE),
    ("soak-activity", "activity", Job.Strategy.LOCAL_RESTART),
)
# Errors of a service the schedule takes down (or that is slow to come back): the step is tried
# again. A Kafka audit waits out a broker away for up to 60 s, then raises TimeoutError.
TRANSIENT_ERRORS = (DatabaseError, redis.RedisError, KafkaException, TimeoutError)


@dataclass(frozen=True)
class SoakSettings:
    minutes: float
    seed: int
    out: Path
    spacing_s: tuple[float, float] = DEFAULT_SPACING_S
    rate: float = 20.0
    audit_every_s: float = 300.0
    sample_every_s: float = 60.0
    settle_s: float = 240.0  # after the schedule: how long its last events may take to be judged
    start_timeout_s: float = 900.0
    kafka: bool = False  # wordcount on Kafka, and kafka-broker faults in the mix
    # Policy fields set for the run (`--policy FIELD=VALUE`), as an admin would before it.
    policy: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        problems = []
        if not 1 <= self.minutes <= 24 * 60:
            problems.append("--minutes: 1 to 1440")
        if not 1 <= self.rate <= 1000:
            problems.append("--rate: 1 to 1000 lines/s")
        if self.audit_every_s < 30 or self.sample_every_s < 10:
            problems.append("--audit-every: at least 30 s; --sample-every: at least 10 s")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def duration_s(self) -> float:
        return self.minutes * 60

    def schedule(self) -> list[Event]:
        return plan_schedule(self.seed, self.duration_s, self.spacing_s, event_kinds(self.kafka))


def add_policy_argument(parser) -> None:
    """`--policy FIELD=VALUE` (repeatable), for the commands that run on the soak's cluster."""
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="set a policy field for the run, as an admin would (repeatable), e.g. "
        "light_input_wait_s=2",
    )


def parse_policy(items: list[str]) -> tuple[tuple[str, str], ...]:
    """["light_input_wait_s=2", ...] (`--policy`, repeatable) -> (("light_input_wait_s", "2"),
    ...); ValueError naming --policy for an item without `=`. The values are checked when the
    run sets them (`set_run_policy`)."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--policy: FIELD=VALUE, not {item!r}")
        pairs.append((name.strip(), value.strip()))
    return tuple(pairs)


def set_run_policy(pairs: tuple[tuple[str, str], ...]) -> dict:
    """A new policy version with `pairs` applied, through the same checks an admin's change
    passes (console.services.policy.change_policy: unknown fields and values out of bounds are
    refused, naming the field); returns the fields as set. RuntimeError when refused."""
    changes = {}
    for name, value in pairs:
        try:
            changes[name] = Policy._meta.get_field(name).to_python(value)
        except (FieldDoesNotExist, ValidationError) as exc:
            raise RuntimeError(f"--policy {name}={value}: {exc}") from None
    try:
        change_policy(changes, reason="set by the run's --policy")
    except PolicyRejected as exc:
        raise RuntimeError("--policy: " + "; ".join(exc.errors.values())) from None
    return {name: getattr(Policy.current(), name) for name in changes}


@contextlib.contextmanager
def soak_services(out: Path, say):
    """The run's Redis and (where the machine can run one) PostgreSQL, with this process's
    Django and Celery pointed at them; yields (redis server, postgres server or None, services,
    a note saying which database is used)."""
    with contextlib.ExitStack() as stack:
        server = PrivateRedis(out / "redis")
        server.start()
        stack.callback(server.stop)
        say(f"[soak] Redis of the run's own at {server.url} (append-only file in {out / 'redis'})")
        why_not = postgres_available()
        postgres = None
        if why_not is None:
            postgres = PrivatePostgres(postgres_bin_dir())
            stack.callback(postgres.destroy)
            postgres.create()
            database_url = postgres.url
            note = f"PostgreSQL of the run's own (port {postgres.port}), restarted by the schedule."
        else:
            database_url = database_url_of_default()
            note = (
                f"No PostgreSQL of its own ({why_not}): the database at {database_url}; "
                "PostgreSQL restarts skipped."
            )
        say(f"[soak] {note}")
        services = Services(server.url, database_url, postgres is not None, True)
        stack.enter_context(django_pointed_at(services, use_database=postgres is not None))
        yield server, postgres, services, note


def clock(elapsed_s: float, total_s: float) -> str:
    def mmss(seconds: float) -> str:
        seconds = max(0, int(seconds))
        return f"{seconds // 60}:{seconds % 60:02d}"

    return f"[soak {mmss(elapsed_s)}/{mmss(total_s)}]"


class Soak(FaultPlay):
    """One run: start the cluster and the jobs, play the schedule, measure, stop everything."""

    def __init__(self, settings: SoakSettings, say: Callable[[str], None], command: str):
        self.settings = settings
        self.say_raw = say
        self.command = command
        self.out = settings.out
        self.group = ProcessGroup(self.out / "logs", say=lambda m: say(f"[soak] launcher: {m}"))
        self.t0: float | None = None
        self.jobs: list[Job] = []
        self.faults: list[dict] = []
        self.audits: list[dict] = []
        self.samples: list[dict] = []
        self.pending: list[Pending] = []
        self.report: dict = {}

    # --- output -----------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.time() - self.t0 if self.t0 else 0.0

    def elapsed_at(self, at: float) -> str:
        """Epoch seconds `at` as seconds into the run ("123.4 s")."""
        return f"{at - self.t0:.1f} s" if self.t0 else f"{at:.1f}"

    def say(self, message: str) -> None:
        self.say_raw(f"{clock(self.elapsed(), self.settings.duration_s)} {message}")

    def write(self, complete: bool = False) -> Path:
        """soak.json as it stands (again after every event, audit and sample)."""
        self.report.update(
            complete=complete,
            faults=self.faults,
            audits=self.audits,
            samples=self.samples,
        )
        return write_report(self.out, "soak.json", self.report)

    # --- the run ----------------------------------------------------------------------------

    def run(self) -> dict:
        s = self.settings
        self.out.mkdir(parents=True, exist_ok=True)
        started = time.time()
        with soak_services(self.out, self.say_raw) as (server, postgres, services, note):
            self.redis_server, self.postgres, self.redis_url = server, postgres, services.redis_url
            self.report = {
                "command": self.command,
                "machine": machine_description(),
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "minutes": s.minutes,
                "seed": s.seed,
                "spacing_s": list(s.spacing_s),
                "rate": s.rate,
                "services": {
                    "redis": services.redis_url,
                    "note": note,
                    "postgres_restarts": postgres is not None,
                },  # fmt: skip
                "schedule": [e.__dict__ for e in s.schedule()],
                "kafka": s.kafka,
            }
            finished = False
            kafka_before = django_settings.KAFKA_BOOTSTRAP_SERVERS
            try:
                self.start_cluster(services)
                self.start_jobs()
                self.report["startup_s"] = round(time.time() - started, 1)
                self.play()
                self.finish()
                finished = True
            finally:
                self.teardown()
                django_settings.KAFKA_BOOTSTRAP_SERVERS = kafka_before
                # Also after an error or Ctrl-C: soak.json says what was measured until then.
                self.report.update(soak_report_figures(self.report, self.faults, self.audits,
                                                       self.samples, s.duration_s))  # fmt: skip
                self.write(complete=finished)
        return self.report

    def start_cluster(self, services: Services) -> None:
        var_dir = self.out / "var"
        self.checkpoints = var_dir / "checkpoints"
        env = {
            **worker_env(services, var_dir),
            "BACKSTOP_CHECKPOINT_ROOT": str(self.checkpoints),
        }
        if self.settings.kafka:
            # Before the workers: they are told where it is. Kept by this process (the
            # kafka-broker fault), in the group that stops with the run.
            bootstrap = start_kafka_if_needed(
                self.group, self.out / "kafka", redis_url=self.redis_url
            )
            env["KAFKA_BOOTSTRAP_SERVERS"] = django_settings.KAFKA_BOOTSTRAP_SERVERS = bootstrap
            self.say_raw(f"[soak] Kafka at {bootstrap} (log {self.out / 'logs' / 'kafka.log'})")
        nodes = ensure_demo_nodes()
        ensure_periodic_tasks()
        if self.settings.policy:
            self.report["policy"] = set_run_policy(self.settings.policy)
            self.say_raw(f"[soak] policy for this run: {self.report['policy']}")
        LocalCluster(
            self.group,
            DEMO_NODES,
            node_mem_mb=nodes[0].mem_total_mb,
            beat_schedule=self.out / "logs" / "beat",
            worker_prefix="soak-",
            env=env,
        ).start(self.redis_url)
        self.say_raw(f"[soak] controller, beat and agents {', '.join(DEMO_NODES)} up "
                     f"(logs: {self.out / 'logs'})")  # fmt: skip

    def start_jobs(self) -> None:
        s = self.settings
        try:
            version, _ = register_topology(USER_JOB)
        except RegistrationRefused as exc:
            raise RuntimeError(f"{USER_JOB} not registered: {'; '.join(exc.errors)}") from None
        self.say_raw(f"[soak] registered {USER_JOB} as {version.ident}")
        user = soak_user()
        stamp = time.strftime("%H%M%S")
        self.jobs = [
            create_job(
                name=f"{name}-{stamp}",
                topology=topology,
                strategy=strategy,
                params={"rate": s.rate, "seed": s.seed},
                user=user,
                **(kafka_io(stamp) if s.kafka and topology == "wordcount" else {}),
            )
            for name, topology, strategy in JOBS
        ]

        def all_running() -> bool:
            for job in self.jobs:
                job.refresh_from_db(fields=["status", "status_reason"])
                if job.status == Job.Status.FAILED:
                    raise RuntimeError(f"job {job.name} failed to start: {job.status_reason}")
            return all(job.status == Job.Status.RUNNING for job in self.jobs)

        wait_for(all_running, s.start_timeout_s, "the three jobs to run", poll_s=2)
        self.t0 = time.time()
        self.report["jobs"] = [
            {"name": j.name, "key": j.key, "topology": j.topology, "strategy": j.strategy}
            for j in self.jobs
        ]
        self.say("jobs running: " + ", ".join(f"{j.name} ({j.strategy})" for j in self.jobs))

    def play(self) -> None:
        """The schedule, with audits and samples between its events, then the settling time
        its last events may need to be judged."""
        s = self.settings
        events = s.schedule()
        self.say(f"{len(events)} events planned, one every {s.spacing_s[0]:g}-{s.spacing_s[1]:g} s")
        next_sample, next_audit = 0.0, s.audit_every_s
        while self.elapsed() < s.duration_s or (
            self.pending and self.elapsed() < s.duration_s + s.settle_s
        ):
            now = self.elapsed()
            close_old_connections()
            try:
                if events and now >= events[0].at_s and now < s.duration_s:
                    self.fire(events.pop(0))
                    self.write()
                if now >= next_sample:
                    self.sample()
                    next_sample += s.sample_every_s
                    self.write()
                # An audit reads a Kafka job's input topic: not while its broker is down.
                if now >= next_audit and now < s.duration_s and not self.broker_away():
                    self.audit()
                    next_audit += s.audit_every_s
                    self.write()
                self.judge_pending()
            except TRANSIENT_ERRORS as exc:
                self.say(f"(retrying after a database, Redis or Kafka error: {str(exc)[:120]})")
                connections.close_all()
            time.sleep(0.5)
        for pending in self.pending:
            self.give_up(pending, f"not judged within {s.settle_s:g} s of the end")
        self.pending = []

    def finish(self) -> None:
        """The final audit and sample (jobs running), then the jobs stopped, housekeeping, and
        what is left of them."""
        self.retry(self.audit)
        self.retry(self.sample)
        self.wait_reprotected()
        self.write()
        for job in self.jobs:
            stop_job(job, "soak over")

        def stopped() -> bool:
            for job in self.jobs:
                job.refresh_from_db(fields=["status"])
            return all(not job.is_live for job in self.jobs)

        wait_for(stopped, 120, "the jobs to stop", poll_s=1)
        client = redis_client()
        purged = purge_old_records(client)
        self.say(f"jobs stopped; housekeeping: {purged}; waiting 15 s for expiring keys")
        time.sleep(15)
        rows = self.read_processes()
        kinds = soak_processes.classify(rows)
        self.report["leaked_processes"] = soak_processes.unowned(rows, kinds, set(), set()) + [
            {"pid": r.pid, "kind": "cpu-hog", "why": "a stress fault's hog still running",
             "cmdline": " ".join(r.argv)[:160]}
            for r in rows if kinds.get(r.pid) == "cpu-hog"
        ]  # fmt: skip
        leaked, by_job = [], {}
        for job in self.jobs:
            keys = sorted(client.scan_iter(match=f"{data_keys.job_prefix(job.key)}*", count=1000))
            with client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.ttl(key)
                ttls = pipe.execute()
            sorted_keys = soak_report.sort_job_keys(list(zip(keys, ttls, strict=True)), job.key)
            leaked += sorted_keys["leaked"]
            by_job[job.name] = {name: len(found) for name, found in sorted_keys.items()}
        client.close()
        self.report["leaked_keys"] = leaked
        self.report["stopped_job_keys"] = by_job
        self.report["job_outcomes"] = self.job_outcomes()
        self.say(f"leaked: {len(self.report['leaked_processes'])} processes, {len(leaked)} keys")

    def wait_reprotected(self) -> None:
        """Until each promotion of the run has its new standby caught up, or has had the
        re-protect goal's time since its fault (the jobs run on meanwhile)."""
        injected = [row["at_s"] for row in self.faults if row["injected"]]
        deadline = self.t0 + max(injected, default=0.0) + soak_report.REPROTECT_GOAL_S
        while True:
            waiting = self.unprotected_promotions()
            if not waiting or time.time() >= deadline:
                break
            self.say(f"waiting for {len(waiting)} promotion(s) to be protected again")
            time.sleep(5)
        for row in waiting:
            self.say(f"#{row['number']} {row['kind']}: not protected again by the end")

    def retry(self, step, attempts: int = 10) -> None:
        for attempt in range(attempts):
            try:
                step()
                return
            except TRANSIENT_ERRORS as exc:
                self.say(f"({step.__name__} failed: {str(exc)[:100]}; again in 3 s)")
                connections.close_all()
                if attempt == attempts - 1:
                    raise
                time.sleep(3)

    def job_outcomes(self) -> list[dict]:
        """Per job: its status, and its recovery episodes (with no fault of the schedule: what
        the control-plane restarts or the load caused)."""
        out = []
        for job in self.jobs:
            job.refresh_from_db()
            episodes = job.recoveries.all()
            out.append({
                "job": job.name,
                "status": job.status,
                "status_reason": job.status_reason,
                "episodes": episodes.count(),
                "episodes_without_fault": episodes.filter(fault__isnull=True).count(),
            })  # fmt: skip
        return out

    def teardown(self) -> None:
        """Stop everything the run started, by pid: the cluster's processes (its ProcessGroup),
        the jobs' stage and generator processes and the warm spares (they run in sessions of
        their own), then anything else whose environment names the run's Redis. The Redis and
        PostgreSQL servers are stopped by soak_services afterwards."""
        self.group.stop()
        ended = kill_job_processes({job.key for job in self.jobs})
        ended += kill_warm_spares(self.redis_url)
        server_pids = self.server_pids()
        for row in self.read_processes():
            if row.pid in server_pids or row.pid == os.getpid():
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(row.pid, signal.SIGKILL)
                ended += 1
        self.report["killed_at_teardown"] = ended
        self.say_raw(f"[soak] stopped the cluster; {ended} job, spare or leftover processes killed")

    # --- events -----------------------------------------------------------------------------

    # --- judging events ---------------------------------------------------------------------

    # --- audits and samples -----------------------------------------------------------------

    def audit(self) -> None:
        client = redis_client()
        try:
            for job in self.jobs:
                comparison = audit_output(job, client)
                row = {
                    "at_s": round(self.elapsed(), 1),
                    "job": job.name,
                    "lost": comparison.lost if comparison else None,
                    "duplicates": comparison.duplicates if comparison else None,
                    "cells": comparison.cells if comparison else None,
                }
                self.audits.append(row)
                self.say(f"audit {job.name}: {row['lost']} lost, {row['duplicates']} duplicated "
                         f"of {row['cells']} results")  # fmt: skip
        finally:
            client.close()

    def server_pids(self) -> set[int]:
        """The run's Redis server and PostgreSQL's processes (the postmaster and its children)."""
        pids = set()
        if self.redis_server.proc is not None and self.redis_server.proc.poll() is None:
            pids.add(self.redis_server.proc.pid)
        if self.postgres is not None:
            pid_file = self.postgres.data_dir / "postmaster.pid"
            with contextlib.suppress(OSError, ValueError, psutil.Error):
                postmaster = psutil.Process(int(pid_file.read_text().split()[0]))
                pids |= {postmaster.pid, *(c.pid for c in postmaster.children(recursive=True))}
        return pids

    def replica_roles(self) -> dict[int, str]:
        """pid -> role (primary or standby) of the run's live replica processes."""
        live = Replica.objects.filter(job__in=self.jobs, state__in=LIVE_REPLICA_STATES)
        return {pid: role for pid, role in live.values_list("pid", "role") if pid}

    def read_processes(self) -> list[soak_processes.ProcRow]:
        """The run's processes: its servers, the cluster's processes (its ProcessGroup's
        children), processes started with `--redis-url` naming the run's Redis (stages, spares,
        generators) and every one whose environment names it (their JVMs, Python workers and
        CPU hogs inherit it). A process that renamed itself (Celery, a spare that took a
        replica: setproctitle) shows a clobbered environment, hence the first three."""
        known = self.server_pids() | {c.proc.pid for c in list(self.group.children.values())}
        rows = []
        now = time.time()
        for proc in psutil.process_iter(["pid", "ppid", "cmdline", "status", "create_time"]):
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            ours = proc.pid in known or (
                cmdline_arg(argv_of(proc.info["cmdline"]), "--redis-url") == self.redis_url
            )
            if not ours and safe_read(proc.environ, {}).get("REDIS_URL") != self.redis_url:
                continue
            memory = safe_read(proc.memory_info, None)
            rows.append(soak_processes.ProcRow(
                pid=proc.pid,
                ppid=proc.info["ppid"] or 0,
                argv=tuple(proc.info["cmdline"] or ()),
                rss_mb=memory.rss / 2**20 if memory else 0.0,
                private_mb=(memory.rss - memory.shared) / 2**20 if memory else 0.0,
                fds=safe_read(proc.num_fds, 0),
                age_s=now - (proc.info["create_time"] or now),
                shmem_mb=shared_memory_mb(proc.pid),
            ))  # fmt: skip
        return rows

    def sample(self) -> None:
        at_s = round(self.elapsed(), 1)
        rows = self.read_processes()
        kinds = soak_processes.classify(rows, self.replica_roles())
        cutoff = timezone.now() - timedelta(seconds=30)
        ended = {
            f"{r.job.key}/{r.local_id}"
            for r in Replica.objects.filter(
                job__in=self.jobs,
                state__in=(Replica.State.FAILED, Replica.State.STOPPED),
                ended_at__lt=cutoff,
            ).select_related("job")
        }
        live_jobs = set(
            Job.objects.filter(pk__in=[j.pk for j in self.jobs], status__in=Job.LIVE_STATUSES)
            .values_list("key", flat=True)
        )  # fmt: skip
        db_rows = {}
        with connection.cursor() as cursor:
            for table in sorted(connection.introspection.table_names()):
                cursor.execute(f'SELECT COUNT(*) FROM "{table}"')  # noqa: S608 (our table names)
                db_rows[table] = cursor.fetchone()[0]
        client = redis_client()
        try:
            memory = client.info("memory")["used_memory"]
            keys_by_job = {
                job.name: sum(1 for _ in client.scan_iter(
                    match=f"{data_keys.job_prefix(job.key)}*", count=1000
                ))
                for job in self.jobs
            }  # fmt: skip
            sample = {
                "at_s": at_s,
                "processes": soak_processes.totals(rows, kinds),
                "process_rows": soak_processes.process_rows(rows, kinds),
                "unowned": soak_processes.unowned(rows, kinds, live_jobs, ended),
                "db_rows": db_rows,
                "redis": {
                    "used_memory_mb": round(memory / 2**20, 2),
                    "keys": client.dbsize(),
                    "keys_by_job": keys_by_job,
                },
                "checkpoint_bytes": directory_bytes(self.checkpoints),
            }
        finally:
            client.close()
        self.samples.append(sample)
        rss = ", ".join(f"{k} {v['rss_mb']:.0f}" for k, v in sample["processes"].items())
        self.say(f"sample: RSS MB {rss}; {sum(db_rows.values())} rows; Redis "
                 f"{sample['redis']['used_memory_mb']} MB, {sample['redis']['keys']} keys; "
                 f"checkpoints {sample['checkpoint_bytes'] / 2**20:.1f} MB; "
                 f"{len(sample['unowned'])} unowned processes")  # fmt: skip


def kafka_io(stamp: str) -> dict:
    """The Kafka source and sink of the run's job on Kafka: topics of the run's own."""
    return {
        "source": {"kind": "kafka", "topic": f"soak-lines-{stamp}"},
        "sink": {"kind": "kafka", "topic": f"soak-counts-{stamp}"},
    }


def shared_memory_mb(pid: int) -> float | None:
    """The shared memory pages process `pid` has touched (RssShmem of /proc/PID/status, which
    psutil does not give apart), in MiB; None if it ended before it was read or Linux gives no
    such line (the goal then skips the sample rather than count its whole RSS)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) / 1024
    return None


def directory_bytes(root: Path) -> int:
    """Bytes of the files under `root` (files that vanish while it is walked count 0)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def soak_report_figures(
    report: dict, faults: list, audits: list, samples: list, duration_s: float
) -> dict:
    """The derived parts of soak.json: RSS at the reference point and the end, per hour, goals."""
    report.setdefault("leaked_processes", [])
    report.setdefault("leaked_keys", [])
    figures = {
        "rss_mb": soak_report.rss_summary(samples, duration_s),
        "per_hour": soak_report.per_hour(faults, audits, samples, duration_s),
    }
    figures["goals"] = soak_report.judge_goals({**report, **figures, "faults": faults,
                                                "audits": audits})  # fmt: skip
    return figures
