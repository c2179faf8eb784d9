"""One size of the fleet from start to teardown (`run_size`), and a curve of sizes (`run_curve`).

A size: the database's nodes, schedules and an admin; the simulated agents; the real controller
processes and beat (started as infra.launcher.LocalCluster starts its controller, in a
ProcessGroup that restarts what exits on its own, except the one the fault schedule kills); N
jobs created through console.services.jobs.create_job, so the controllers launch them; a warm-up
until every job runs; the measured window with the fault schedule; a grace period for the last
failures' answers; the processes stopped; the console's pages timed against what the run left.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

import psutil
import redis
from django.contrib.auth.models import User
from django.db import connection

from bench.fleet import measure
from bench.fleet.chaos import ControllerPauser, OperatorChaos, plan_pauses
from bench.fleet.schedule import (
    CONTROLLER,
    NODE,
    PROCESS,
    FaultRecord,
    FaultRunner,
    plan_faults,
)
from bench.fleet.services import METRICS_TOKEN, Services, empty_database, worker_env
from bench.fleet.sim import FleetSim
from bench.fleet.sim_model import SimTiming
from bench.pages import time_pages
from console.models import ControlDecision, Job, Node, Policy
from console.services.jobs import create_job
from console.services.schedules import ensure_periodic_tasks
from infra import keys as control_keys
from infra.launcher import celery_argv, controller_argv, wait_for
from infra.process_group import ProcessGroup
from infra.queues import CONTROL_QUEUE, node_queue
from spark_runtime.command_fence import holder_of

TOPOLOGIES = ("wordcount", "topn", "traffic")
STRATEGIES = ("adaptive", "local-restart", "restart-all", "active-all")
ADMIN = "fleet-admin"
JOB_PREFIX = "fleet-"


@dataclass(frozen=True)
class FleetConfig:
    """One size of the fleet and how it is exercised."""

    jobs: int
    nodes: int
    controllers: int
    duration_s: float
    seed: int = 7
    kill_every_s: float = 2.0  # process kills: one every this many seconds (seeded jitter)
    node_kills: int | None = None  # default: one when there are 3 nodes or more, 60 s or more
    node_down_s: float = 20.0
    controller_kill: bool = True
    controller_restart_after_s: float | None = None
    controller_concurrency: int = 8
    warmup_timeout_s: float = 300.0
    settle_s: float = 10.0
    grace_s: float = 10.0
    page_requests: int = 20
    rate: float = 10.0  # the jobs' input rate (0: no generator, so no start_generator messages)
    stop_grace_s: float = 10.0  # SIGTERM, then SIGKILL the controllers this much later
    timing: SimTiming = field(default_factory=SimTiming)
    # The chaos run (bench/fleet/chaos.py): controller pauses, upgrades whose controller is
    # killed in the middle (with the operators' requests), the policy's validation window for
    # them, and how long the run waits after the window for the last requests to take effect.
    pause_controllers: int = 0
    kill_during_upgrade: int = 0
    upgrade_validation_s: float = 30.0
    chaos_settle_s: float = 300.0

    def __post_init__(self):
        problems = []
        if not 1 <= self.jobs <= 2000:
            problems.append("--jobs: 1 to 2000")
        if not 1 <= self.nodes <= 200:
            problems.append("--nodes: 1 to 200")
        if not 1 <= self.controllers <= 16:
            problems.append("--controllers: 1 to 16")
        if self.duration_s < 10:
            problems.append("--duration: at least 10 s")
        if not 0 <= self.pause_controllers <= 100:
            problems.append("--pause-controllers: 0 to 100")
        if not 0 <= self.kill_during_upgrade <= 20:
            problems.append("--kill-during-upgrade: 0 to 20")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def chaos(self) -> bool:
        """Whether this is a chaos run of the control plane (issue 58)."""
        return bool(self.pause_controllers or self.kill_during_upgrade)

    @property
    def restart_after_s(self) -> float | None:
        """When the scheduled controller kill's controller is started again (None: never). A
        chaos run keeps the count of controllers as asked: started again at once, as its
        controllers killed in upgrades are."""
        if self.controller_restart_after_s is None and self.chaos:
            return 0.0
        return self.controller_restart_after_s

    @property
    def kills_controller(self) -> bool:
        """A controller is killed when another can take over, or it is started again."""
        return self.controller_kill and (self.controllers >= 2 or self.restart_after_s is not None)


def node_names(count: int) -> list[str]:
    return [f"fleet-node-{i:02d}" for i in range(1, count + 1)]


def job_mix(count: int, seed: int) -> list[tuple[str, str]]:
    """(topology, strategy) of each job: every pair of the three topologies and four strategies
    in turn, in a seeded order."""
    pairs = [(t, s) for s in STRATEGIES for t in TOPOLOGIES]
    mix = [pairs[i % len(pairs)] for i in range(count)]
    random.Random(seed).shuffle(mix)
    return mix


def admin_user() -> User:
    user, _ = User.objects.get_or_create(username=ADMIN)
    user.is_staff = user.is_superuser = True
    user.set_unusable_password()
    user.save()
    return user


def prepare_database(config: FleetConfig) -> User:
    """The fleet's nodes (with the simulated capacity), the controller's schedules, the policy
    in force and an admin to create jobs and read pages as."""
    ensure_periodic_tasks()
    policy = Policy.current()
    if config.kill_during_upgrade and policy.upgrade_validation_s != config.upgrade_validation_s:
        # The upgrades' validation window, the rest of the policy as it is.
        Policy.objects.create(
            **{**asdict(policy.to_config()), "upgrade_validation_s": config.upgrade_validation_s},
            reason="fleet_sim: the chaos run's upgrade validation window",
        )
    for name in node_names(config.nodes):
        Node.objects.update_or_create(
            name=name,
            defaults={
                "cpu_total": config.timing.node_cpu,
                "mem_total_mb": config.timing.node_mem_mb,
                "state": Node.State.UNKNOWN,
            },
        )
    return admin_user()


def end_earlier_fleet_jobs() -> int:
    """Mark stopped the live jobs an earlier size (or run) left in a database that is not the
    run's own: a new size's controllers would otherwise supervise them too."""
    live = list(Job.objects.filter(status__in=Job.LIVE_STATUSES, name__startswith=JOB_PREFIX))
    for job in live:
        job.request_stop("fleet_sim: an earlier size")
        job.mark_stopped("fleet_sim: an earlier size")
    return len(live)


class Fleet:
    """The controller processes and beat of one size, in a ProcessGroup."""

    def __init__(self, config: FleetConfig, services: Services, log_dir: Path, say):
        self.config = config
        self.env = worker_env(services, log_dir)
        self.group = ProcessGroup(log_dir, say=say)
        self.log_dir = log_dir
        self.redis_url = services.redis_url

    def argv(self, name: str) -> list[str]:
        return controller_argv(f"fleet-{name}@%h", self.config.controller_concurrency)

    def start(self) -> None:
        for i in range(1, self.config.controllers + 1):
            self.group.start(f"controller-{i}", self.argv(f"controller-{i}"), env=self.env)
        self.group.start(
            "beat",
            celery_argv("beat", "--loglevel", "INFO", "--schedule", str(self.log_dir / "beat")),
            env=self.env,
        )

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until every controller's log says it is ready (Celery's `ready.` line)."""

        def ready() -> bool:
            for name in self.controllers():
                log = self.log_dir / f"{name}.log"
                if not log.exists() or " ready." not in log.read_text(errors="replace"):
                    return False
            return True

        wait_for(ready, timeout_s, f"the controllers to be ready (logs in {self.log_dir})")

    def controllers(self) -> list[str]:
        return sorted(n for n in list(self.group.children) if n.startswith("controller"))

    def processes(self) -> dict[str, int]:
        return {name: child.proc.pid for name, child in list(self.group.children.items())}

    def kill_controller(self, job_keys: list[str]) -> tuple[str, int, float, dict] | None:
        """SIGKILL the first controller, for good: (name, pid, when, lease holders just
        before, spark_runtime.command_fence.holder_of)."""
        names = self.controllers()
        if not names:
            return None
        name = names[0]
        pid = self.group.children[name].proc.pid
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        values = client.mget([control_keys.controller_lease(k) for k in job_keys])
        at = time.time()
        self.group.kill(name)
        return name, pid, at, {k: holder_of(v) for k, v in zip(job_keys, values, strict=True)}

    def restart(self, name: str) -> None:
        self.group.start(name, self.argv(name), env=self.env)

    def stop(self) -> None:
        self.group.stop(grace_s=self.config.stop_grace_s)


def reset_redis(client, private: bool, nodes: list[str]) -> None:
    """A clean slate: everything in the run's own Redis; else the node and control queues."""
    if private:
        client.flushdb()
    else:
        client.delete(CONTROL_QUEUE, *(node_queue(n) for n in nodes))


def failures_of(sim: FleetSim, records: list[FaultRecord]) -> tuple[list, list]:
    """The process kills (each at the moment its exit was reported) and the node kills' replicas
    (at the moment the node died)."""
    process = [
        measure.Failure(PROCESS, e.at, e.job, e.stage, e.replica_id)
        for e in sim.exit_log
        if e.cause == "fault"
    ]
    node = [
        measure.Failure(NODE, r.at, v["job"], v["stage"], v["replica_id"], v["role"])
        for r in records
        if r.kind == NODE and not r.skipped
        for v in r.victims
    ]
    return process, node


def run_size(
    config: FleetConfig,
    services: Services,
    out_dir: Path,
    say: Callable[[str], None],
    label: str = "[fleet]",
) -> dict:
    """Run one size of the fleet; returns its figures (and, under `series`, what the plot
    draws)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = out_dir / f"logs-{config.jobs}"
    client = redis.Redis.from_url(services.redis_url, decode_responses=True)
    nodes = node_names(config.nodes)
    reset_redis(client, services.private_redis, nodes)
    admin = prepare_database(config)
    sim = FleetSim(services.redis_url, nodes, config.timing, config.seed)
    fleet = Fleet(config, services, log_dir, say)
    sampler = faults = pauser = chaos = None
    try:
        sim.start()
        wait_for(
            lambda: all(client.exists(control_keys.node_heartbeat(n)) for n in nodes),
            30,
            "the simulated agents' heartbeats",
        )
        say(f"{label} {config.jobs} jobs: starting {config.controllers} controller(s) and beat")
        fleet.start()
        fleet.wait_ready()
        say(f"{label} {config.jobs} jobs: creating the jobs")
        created_at: dict[str, float] = {}
        for i, (topology, strategy) in enumerate(job_mix(config.jobs, config.seed)):
            job = create_job(
                name=f"{JOB_PREFIX}{i + 1:04d}",
                topology=topology,
                strategy=strategy,
                params={"rate": config.rate, "seed": i},
                user=admin,
            )
            created_at[job.key] = time.time()
        job_keys = list(created_at)
        sampler = measure.Sampler(
            services.redis_url,
            job_keys,
            stages=lambda: sorted(sim.stages_seen),
            processes=fleet.processes,
            db_settings=dict(connection.settings_dict),
        )
        sampler.start()
        warm_started = time.time()
        warmup_s = warm_up(config, job_keys, say, label)
        say(f"{label} {config.jobs} jobs: settling {config.settle_s:g} s")
        time.sleep(config.settle_s)

        # --- the measured window ---
        plan = plan_faults(
            config.duration_s, config.seed, config.kill_every_s, config.nodes,
            config.controllers, config.node_kills, config.kills_controller,
        )  # fmt: skip
        faults = FaultRunner(
            sim,
            plan,
            config.seed,
            kill_controller=lambda: fleet.kill_controller(job_keys),
            restart_controller=fleet.restart,
            restart_after_s=config.restart_after_s,
            node_down_s=config.node_down_s,
            say=lambda m: say(f"{label} {config.jobs} jobs: {m}"),
        )
        if config.pause_controllers:
            pauser = ControllerPauser(
                fleet,
                plan_pauses(config.duration_s, config.pause_controllers, config.seed),
                config.seed,
                say=lambda m: say(f"{label} {config.jobs} jobs: {m}"),
            )
        if config.chaos:
            chaos = OperatorChaos(
                fleet, sim, faults, job_keys, admin, config.duration_s,
                config.kill_during_upgrade, config.seed, dict(connection.settings_dict),
                services.redis_url, say=lambda m: say(f"{label} {config.jobs} jobs: {m}"),
            )  # fmt: skip
        method = measure.db_method()
        rows_before = measure.row_counts()
        db_before = measure.db_counters(method)
        statements_before = measure.statement_calls(method)
        redis_before = measure.redis_counters(client)
        sim_cmds_before, sampler_cmds_before = sim.commands_sent, sampler.redis_commands
        own_cpu_before = measure.own_cpu_s()
        t0 = time.time()
        faults.start(t0)
        for part in (pauser, chaos):
            if part is not None:
                part.start(t0)
        say(f"{label} {config.jobs} jobs: measuring {config.duration_s:g} s under faults")
        next_note = t0 + 15
        live_replicas = []
        while time.time() < t0 + config.duration_s:
            time.sleep(min(1.0, max(0.0, t0 + config.duration_s - time.time())))
            live_replicas.append(sim.snapshot()["processes"])
            if time.time() >= next_note:
                next_note += 15
                state = sim.snapshot()
                say(
                    f"{label} {config.jobs} jobs: {time.time() - t0:.0f}/{config.duration_s:g} s,"
                    f" {len(faults.records)} faults, {state['running']}/{state['processes']} "
                    f"replicas running, {state['nodes_up']}/{config.nodes} nodes up"
                )
        t1 = time.time()
        db_after = measure.db_counters(method)
        top_statements = measure.top_statements(
            statements_before, measure.statement_calls(method), t1 - t0
        )
        redis_after = measure.redis_counters(client)
        sim_cmds_after, sampler_cmds_after = sim.commands_sent, sampler.redis_commands
        own_cpu_after = measure.own_cpu_s()
        rows_after = measure.row_counts()
        own_queries = sum(1 for t in sampler.db_queries if t0 <= t <= t1)
        say(f"{label} {config.jobs} jobs: {config.grace_s:g} s for the last answers")
        time.sleep(config.grace_s)
        observed_until = time.time()
        faults.stop()
        settled_s = None
        operator_requests, upgrades = {"sent": 0, "lost": 0}, {"started": 0, "unfinished": 0}
        if pauser is not None:
            pauser.stop()
        if chaos is not None:
            say(f"{label} {config.jobs} jobs: up to {config.chaos_settle_s:g} s for the "
                "operators' requests and the upgrades to end")  # fmt: skip
            settled_s = chaos.settle(config.chaos_settle_s)
            chaos.stop()
            operator_requests, upgrades = chaos.figures()
        sampler.stop()
        from_decisions = decisions_between(t0, t1)
    finally:
        for part in (faults, pauser, chaos, sampler):
            if part is not None:
                part.stop()
        fleet.stop()
        sim.stop()
        connection.close()

    say(f"{label} {config.jobs} jobs: timing the pages ({config.page_requests} requests each)")
    pages = time_pages(admin, METRICS_TOKEN, config.page_requests)

    window = t1 - t0
    process_failures, node_failures = failures_of(sim, faults.records)
    actions = measure.actions_of(sim.queue_log, sim.control_log)
    controller_kill = next((r for r in faults.records if r.kind == CONTROLLER), None)
    lease_stats = measure.unsupervised(
        sampler.lease_samples, job_keys, created_at, sampler.status_samples
    )
    lease_window = measure.unsupervised(
        sampler.lease_samples, job_keys, created_at, sampler.status_samples, t0, t1
    )
    take = None
    if controller_kill is not None and not controller_kill.skipped:
        take = measure.takeover(
            sampler.lease_samples, job_keys, controller_kill.at, controller_kill.pid,
            controller_kill.holders_before, sampler.status_samples,
        )  # fmt: skip
    upgrade_kills = [r for r in (chaos.upgrades if chaos else []) if r.killed_at is not None]
    upgrade_takes = [
        measure.takeover(
            sampler.lease_samples,
            job_keys,
            r.killed_at,
            r.killed_pid,
            r.holders_before,
            sampler.status_samples,
        )  # fmt: skip
        for r in upgrade_kills
    ]
    upgrades["takeover_s"] = [t["takeover_s"] for t in upgrade_takes]
    # Every controller kill's takeover: the scheduled one and those in upgrades (None when a
    # job of a killed controller was never taken over).
    takes = [t for t in (take, *upgrade_takes) if t is not None]
    takeover_s = (
        None
        if not takes or any(t["takeover_s"] is None for t in takes)
        else max(t["takeover_s"] for t in takes)
    )
    # Controllers that could not answer: paused ones until they were let go on, killed ones.
    pauses = pauser.records if pauser else []
    outages = [measure.Outage(p.pid, p.at, p.until or t1) for p in pauses]
    outages += [measure.Outage(r.killed_pid, r.killed_at, math.inf) for r in upgrade_kills]
    if controller_kill is not None and not controller_kill.skipped:
        outages.append(measure.Outage(controller_kill.pid, controller_kill.at, math.inf))
    unattended = measure.unattended(sampler.lease_samples, job_keys, outages)

    fence = sim.fence_figures()
    controllers = measure.process_figures(sampler.process_samples, t0, t1, "controller")
    beat = measure.process_figures(sampler.process_samples, t0, t1, "beat")
    queries = _delta(db_before, db_after, "queries")
    transactions = _delta(db_before, db_after, "transactions")
    if queries is not None:
        queries -= own_queries
    if transactions is not None:
        # The status reads, and the before-snapshot's own statements (committed after it read).
        transactions -= own_queries + (2 if method == "pg_stat_statements" else 1)
    counted = queries if method == "pg_stat_statements" else transactions
    redis_total = redis_after["total"] - redis_before["total"]
    sim_cmds = sim_cmds_after - sim_cmds_before
    sampler_cmds = sampler_cmds_after - sampler_cmds_before
    growth = {
        table: round((rows_after[table] - rows_before.get(table, 0)) / (window / 60), 1)
        for table in rows_after
        if rows_after[table] != rows_before.get(table, 0)
    }
    statuses = dict(Job.objects.filter(key__in=job_keys).values_list("key", "status"))
    figures = {
        "jobs": config.jobs,
        "nodes": config.nodes,
        "controllers": config.controllers,
        # Stage replicas the simulated agents ran, on average over the window (and at most).
        "replicas": round(sum(live_replicas) / max(1, len(live_replicas))),
        "replicas_max": max(live_replicas, default=0),
        "duration_s": round(window, 1),
        "warmup_s": round(warmup_s, 1),
        "failure_to_action_ms": measure.match(process_failures, actions, observed_until),
        # The same without the failures of the killed controller's jobs before they were taken
        # over: those wait for the takeover, which controller_takeover_s measures.
        "failure_to_action_ms_supervised": measure.match(
            [f for f in process_failures if not unattended(f.job, f.at)], actions, observed_until
        ),
        "node_failure_to_action_ms": measure.match(node_failures, actions, observed_until),
        "max_unsupervised_s": lease_stats["max_s"],
        "unsupervised": {"whole_run": lease_stats, "window": lease_window},
        "controller_takeover_s": takeover_s,
        "takeover": take,
        # The chaos run's figures (issue 58): commands carried out for a controller that no
        # longer held the job, and those the fence refused; replica ids started twice; the
        # operators' requests and the upgrades (bench/fleet/chaos.py).
        "stale_commands_executed": fence["stale_commands_executed"],
        "stale_commands_refused": fence["stale_commands_refused"],
        "duplicate_replica_starts": fence["duplicate_replica_starts"],
        "operator_requests": operator_requests,
        "upgrades": {**upgrades, "settled_s": _round(settled_s)},
        "epoch_regressions": len(sampler.regressions),
        "epoch_regression_examples": sampler.regressions[:5],
        "stages_watched": len(sampler.fence_last),
        "controller_cpu_cores": controllers["cpu_cores"],
        "controller_rss_mb": controllers["rss_mb"],
        "controller_rss_mb_total": controllers["rss_mb_total"],
        "beat_cpu_cores": beat["cpu_cores"],
        "sim_cpu_cores": round((own_cpu_after - own_cpu_before) / window, 3),
        "db_queries_per_job_s": _per(counted, config.jobs * window, 3),
        "db_method": method or f"none ({connection.vendor}: counters are PostgreSQL's)",
        "db_queries_per_s": _per(counted, window, 1),
        "db_transactions_per_s": _per(transactions, window, 1),
        "db_top_statements": top_statements,
        "redis_commands_per_s": round(redis_total / window, 1),
        "redis_commands_per_s_by": {
            "simulated agents and stages": round(sim_cmds / window, 1),
            "measurement": round(sampler_cmds / window, 1),
            "controllers, beat and Celery": round(
                (redis_total - sim_cmds - sampler_cmds) / window, 1
            ),
        },
        "redis_top_commands_per_s": top_commands(redis_before, redis_after, window),
        "redis_cpu_cores": round((redis_after["cpu_s"] - redis_before["cpu_s"]) / window, 3),
        "metric_rows_per_min": growth.get("console_metricsample", 0.0),
        "table_rows_per_min": growth,
        "pages_p95_ms": pages["p95_ms"],
        "pages": pages,
        "faults": {
            **fault_summary(faults.records),
            "controller_pauses": len(pauses),
            "controller_kills_in_upgrades": len(upgrade_kills),
        },
        "fault_log": sorted(
            [fault_entry(r, t0) for r in faults.records if not r.skipped]
            + [pause_entry(p, t0) for p in pauses]
            + [upgrade_kill_entry(r, t0) for r in upgrade_kills],
            key=lambda e: e["at"],
        ),
        "controller_kill": _kill_detail(controller_kill),
        "controller_decisions": from_decisions,
        "jobs_by_status": _count(statuses.values()),
        "sim": {
            "fence": fence,
            "collisions": dict(sim.collisions),
            "counts": dict(sim.counts),
            "errors": sim.errors[:5],
            "timing": {k: v for k, v in vars(config.timing).items()},
        },
        "machine": machine(),
        "warm_started_at": warm_started,
        "window": [t0, t1],
    }
    figures["series"] = plot_series(sampler, job_keys, created_at, process_failures, actions, t0)
    return figures


def warm_up(config: FleetConfig, job_keys: list[str], say, label: str) -> float:
    """Until every job runs (or has failed), or warmup_timeout_s; returns how long it took."""
    started = time.time()
    next_note = started
    while True:
        statuses = list(Job.objects.filter(key__in=job_keys).values_list("status", flat=True))
        running = statuses.count(Job.Status.RUNNING)
        failed = statuses.count(Job.Status.FAILED)
        elapsed = time.time() - started
        if running + failed >= len(job_keys) or elapsed > config.warmup_timeout_s:
            say(f"{label} {config.jobs} jobs: warm after {elapsed:.0f} s "
                f"({running} running, {failed} failed)")  # fmt: skip
            return elapsed
        if time.time() >= next_note:
            next_note += 10
            say(f"{label} {config.jobs} jobs: warming up {elapsed:.0f} s "
                f"({running}/{len(job_keys)} running, {failed} failed)")  # fmt: skip
        time.sleep(1.0)


def decisions_between(t0: float, t1: float) -> dict:
    """The controllers' recorded decisions in the window, by kind (what they saw and did)."""
    rows = ControlDecision.objects.filter(
        at__gte=datetime.fromtimestamp(t0, tz=UTC), at__lte=datetime.fromtimestamp(t1, tz=UTC)
    ).values_list("kind", flat=True)
    return _count(rows)


def _count(values) -> dict:
    out: dict[str, int] = {}
    for value in values:
        out[str(value)] = out.get(str(value), 0) + 1
    return dict(sorted(out.items()))


def _delta(before: dict, after: dict, key: str):
    if key not in before or key not in after:
        return None
    return after[key] - before[key]


def _per(count, seconds: float, digits: int):
    return None if count is None else round(count / max(1e-9, seconds), digits)


def top_commands(before: dict, after: dict, window: float, top: int = 8) -> dict:
    delta = {
        name: calls - before["commands"].get(name, 0) for name, calls in after["commands"].items()
    }
    busiest = sorted(delta.items(), key=lambda kv: -kv[1])[:top]
    return {name: round(calls / window, 1) for name, calls in busiest if calls}


def fault_summary(records: list[FaultRecord]) -> dict:
    done = [r for r in records if not r.skipped]
    return {
        "process_kills": sum(1 for r in done if r.kind == PROCESS),
        "node_kills": sum(1 for r in done if r.kind == NODE),
        "controller_kills": sum(1 for r in done if r.kind == CONTROLLER),
        "skipped": _count(f"{r.kind}: {r.skipped}" for r in records if r.skipped),
    }


def fault_entry(record: FaultRecord, t0: float) -> dict:
    """One fault as fleet.json lists it."""
    entry = {"kind": record.kind, "at": record.at, "offset_s": round(record.at - t0, 2)}
    if record.kind == PROCESS:
        entry.update(job=record.job, stage=record.stage, replica_id=record.replica_id,
                     role=record.role, node=record.node)  # fmt: skip
    elif record.kind == NODE:
        entry.update(node=record.node, replicas=len(record.victims))
    else:
        entry.update(controller=record.controller, pid=record.pid)
    return entry


def pause_entry(record, t0: float) -> dict:
    """A controller pause as fleet.json lists it."""
    until = record.until if record.until is not None else record.at + record.planned_s
    return {
        "kind": "controller_pause", "at": record.at, "offset_s": round(record.at - t0, 2),
        "controller": record.controller, "pid": record.pid, "paused_s": round(until - record.at, 2),
    }  # fmt: skip


def upgrade_kill_entry(record, t0: float) -> dict:
    """A controller killed in the middle of an upgrade, as fleet.json lists it."""
    return {
        "kind": "controller_kill_in_upgrade", "at": record.killed_at,
        "offset_s": round(record.killed_at - t0, 2), "controller": record.killed,
        "pid": record.killed_pid, "job": record.job, "upgrade": record.upgrade_id,
        "phase": record.kill_in,
    }  # fmt: skip


def _round(value, digits: int = 1):
    return None if value is None else round(value, digits)


def _kill_detail(record: FaultRecord | None) -> dict | None:
    if record is None or record.skipped:
        return None
    return {
        "controller": record.controller,
        "pid": record.pid,
        "at": record.at,
        "restarted_at": record.restarted_at,
        "leases_before": sum(1 for v in record.holders_before.values() if v),
    }


def machine() -> dict:
    return {"cores": psutil.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}


def plot_series(sampler, job_keys, created_at, failures, actions, t0) -> dict:
    """What the plot of one size draws: live jobs without a lease holder over time, each
    process kill's time to the controller's command, each controller's CPU over 5 s steps."""
    live = {key: measure.liveness(sampler.status_samples, key) for key in job_keys}
    unheld = []
    for at, holders in sampler.lease_samples:
        n = sum(
            1
            for key, holder in zip(job_keys, holders, strict=True)
            if holder is None
            and at >= created_at[key] + measure.EXCLUDE_AFTER_LAUNCH_S
            and live[key](at)
        )
        unheld.append((round(at - t0, 2), n))
    delays = [
        (round(failure.at - t0, 2), round((first.at - failure.at) * 1000, 1))
        for failure, first in measure.first_answers(failures, actions)
        if first is not None
    ]
    cpu = []
    last: dict[int, tuple[float, float]] = {}
    for sample in sampler.process_samples:
        if not sample.name.startswith("controller"):
            continue
        previous = last.get(sample.pid)
        if previous is None:
            last[sample.pid] = (sample.at, sample.cpu_s)
        elif sample.at - previous[0] >= 5.0:
            last[sample.pid] = (sample.at, sample.cpu_s)
            cores = (sample.cpu_s - previous[1]) / (sample.at - previous[0])
            cpu.append((round(sample.at - t0, 2), sample.name, round(cores, 3)))
    return {"unheld": unheld, "failure_delays": delays, "controller_cpu": cpu}


def run_curve(
    base: FleetConfig,
    sizes: list[int],
    services: Services,
    out_dir: Path,
    say: Callable[[str], None],
) -> list[dict]:
    """Each size in turn on the same services, emptied between sizes (the run's own database;
    another's keeps its rows, with the earlier sizes' jobs marked stopped)."""
    results = []
    for index, jobs in enumerate(sizes, start=1):
        label = f"[fleet {index}/{len(sizes)}]"
        if index > 1:
            if services.private_database:
                empty_database()
            else:
                ended = end_earlier_fleet_jobs()
                if ended:
                    say(f"{label} marked {ended} job(s) of the earlier size stopped")
        results.append(run_size(replace(base, jobs=jobs), services, out_dir, say, label))
    return results
