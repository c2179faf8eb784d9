"""What a fleet run measures, and how. Every figure comes from what was observed, not from a
setting:

- leases: every SAMPLE_S the Sampler reads every job's `infra.keys.controller_lease` in one
  MGET and keeps who holds it (spark_runtime.command_fence.holder_of: nobody when released).
  A live job (its status, read from the database every STATUS_EVERY_S, live at the reads
  before and after) without a holder is unsupervised; `unsupervised` finds the longest such
  stretch of any job, from 10 s after the job was created;
- jobs without a live controller: a failure's job whose lease had no holder at the sample
  before it, or changed hands in the second before it, or whose holder was paused (SIGSTOP) or
  killed in the second after it, waits for a takeover or a resumption;
  `failure_to_action_ms_supervised` leaves those out;
- controller takeover: the jobs the killed controller held (their lease tokens name its pid, as
  console.services.fleet's owners do; for tokens that do not, the leases that were left to
  expire 4-6 s after the kill) and the time until each is held by another controller;
- fencing epochs: the same samples read every stage's `spark_runtime.keys.fence`; a value lower
  than the one before is a regression;
- failure to action: from the moment the simulator put a killed process's exit on the agent
  events stream (or, for a node kill, the moment the node died) to the first command of the
  controller for that job and stage that reached the edge: a start_replica or kill_replica on a
  node queue (the time it landed there, from its LPUSH's keyspace event; the simulated agent
  pops it at once while its node is up, a dead node's agent only when it is back), or a
  promote landing on a replica's control list;
- controller CPU and memory: psutil's CPU time (with children) and RSS of each controller
  process, sampled every second; CPU time over the window divided by its wall time;
- database queries: pg_stat_statements' calls in the fleet's database (utility statements not
  tracked) over the window, less the Sampler's own status reads, per job and second; without
  pg_stat_statements, pg_stat_database's xact_commit + xact_rollback (each autocommit query is
  one transaction; queries grouped in one transaction count once);
- Redis: INFO's total_commands_processed over the window per second, with the simulator's own
  commands (it counts them) and the Sampler's shown apart, and the busiest commands;
- table growth: rows of every console table before and after the window, per minute;
- pages: bench/pages.py (server time through Django's test Client in this process).
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import redis
from django.apps import apps
from django.db import DatabaseError, connection, connections
from django.db.utils import load_backend

from console.models import Job
from console.services.fleet import LEASE_S
from infra import keys as control_keys
from infra import tasks
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import holder_of

log = logging.getLogger(__name__)

SAMPLE_S = 0.5
PROCESS_SAMPLE_S = 1.0
STATUS_EVERY_S = 5.0
EXCLUDE_AFTER_LAUNCH_S = 10.0
ACTION_TIMEOUT_S = 30.0
LIVE = {str(s) for s in Job.LIVE_STATUSES}
QUEUE_ACTIONS = {tasks.START_REPLICA.name, tasks.KILL_REPLICA.name}


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(values_s: list[float]) -> dict:
    """{p50, p99, count, max} in milliseconds of durations given in seconds."""
    ms = [v * 1000 for v in values_s]
    return {
        "p50": _round(percentile(ms, 50)),
        "p99": _round(percentile(ms, 99)),
        "max": _round(max(ms) if ms else None),
        "count": len(ms),
    }


def _round(value, digits: int = 1):
    return None if value is None else round(value, digits)


# --- the sampler ------------------------------------------------------------------------------


@dataclass
class ProcessSample:
    at: float
    name: str
    pid: int
    cpu_s: float
    rss_mb: float
    created: float


@dataclass
class Sampler:
    """Samples leases and fencing epochs (SAMPLE_S), the controller and beat processes
    (PROCESS_SAMPLE_S) and the jobs' statuses (STATUS_EVERY_S) in a thread."""

    redis_url: str
    job_keys: list[str]
    stages: Callable[[], list[tuple[str, str]]]  # (job, stage) pairs to watch, grows
    processes: Callable[[], dict[str, int]]  # name -> pid of the controllers and beat
    # The database settings of the thread that made the sampler (Django's connections are per
    # thread: this one must read the fleet's database, not the settings' default).
    db_settings: dict | None = None
    lease_samples: list[tuple[float, list]] = field(default_factory=list)
    fence_last: dict[tuple[str, str], int] = field(default_factory=dict)
    regressions: list[dict] = field(default_factory=list)
    fence_reads: int = 0
    process_samples: list[ProcessSample] = field(default_factory=list)
    status_samples: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    db_queries: list[float] = field(default_factory=list)  # when it asked the database
    redis_commands: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _procs: dict[int, psutil.Process] = field(default_factory=dict)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleet-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        if self.db_settings is not None:
            use_database_in_this_thread(self.db_settings)
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        lease_keys = [control_keys.controller_lease(k) for k in self.job_keys]
        next_process = next_status = 0.0
        try:
            while not self._stop.is_set():
                started = time.time()
                try:
                    self._sample_redis(client, lease_keys, started)
                except redis.RedisError as exc:
                    log.warning("fleet sampler: %s", exc)
                if started >= next_process:
                    next_process = started + PROCESS_SAMPLE_S
                    self._sample_processes(started)
                if started >= next_status:
                    next_status = started + STATUS_EVERY_S
                    self._sample_statuses(started)
                self._stop.wait(max(0.0, SAMPLE_S - (time.time() - started)))
            self._sample_statuses(time.time())
        finally:
            connection.close()

    def _sample_redis(self, client, lease_keys: list[str], now: float) -> None:
        # Who holds each job: a released lease (`released#` + token) is held by nobody.
        holders = [holder_of(v) for v in client.mget(lease_keys)] if lease_keys else []
        self.lease_samples.append((now, holders))
        pairs = sorted(self.stages())
        self.redis_commands += 1
        if not pairs:
            return
        values = client.mget([data_keys.fence(job, stage) for job, stage in pairs])
        self.redis_commands += 1
        self.fence_reads += 1
        for pair, raw in zip(pairs, values, strict=True):
            if raw is None:
                continue
            value = int(raw)
            before = self.fence_last.get(pair)
            if before is not None and value < before:
                self.regressions.append(
                    {"at": now, "job": pair[0], "stage": pair[1], "from": before, "to": value}
                )
            self.fence_last[pair] = value

    def _sample_processes(self, now: float) -> None:
        for name, pid in self.processes().items():
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = self._procs[pid] = psutil.Process(pid)
                tree = [proc, *proc.children(recursive=True)]
                cpu = rss = 0.0
                for member in tree:
                    with_times = member.cpu_times()
                    cpu += with_times.user + with_times.system
                    rss += member.memory_info().rss / 2**20
                created = proc.create_time()
            except psutil.Error:
                continue
            self.process_samples.append(ProcessSample(now, name, pid, cpu, rss, created))

    def _sample_statuses(self, now: float) -> None:
        try:
            rows = dict(Job.objects.filter(key__in=self.job_keys).values_list("key", "status"))
        except DatabaseError as exc:
            log.warning("fleet sampler: job statuses: %s", exc)
            return
        self.db_queries.append(now)
        self.status_samples.append((now, rows))


def use_database_in_this_thread(settings_dict: dict) -> None:
    """This thread's `default` connection to the database `settings_dict` describes."""
    connections["default"] = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(
        dict(settings_dict), "default"
    )


# --- leases -----------------------------------------------------------------------------------


def liveness(status_samples: list[tuple[float, dict]], job: str) -> Callable[[float], bool]:
    """Whether `job` was live at a time: live at the status reads before and after it."""
    times = [t for t, _ in status_samples]
    states = [rows.get(job) in LIVE for _, rows in status_samples]

    def live(at: float) -> bool:
        if not times:
            return False
        i = bisect.bisect_right(times, at)  # reads at or before `at`: times[:i]
        before = states[i - 1] if i else states[0]
        j = bisect.bisect_left(times, at)  # reads at or after `at`: times[j:]
        after = states[j] if j < len(times) else states[-1]
        return before and after

    return live


def unsupervised(
    lease_samples: list[tuple[float, list]],
    job_keys: list[str],
    created_at: dict[str, float],
    status_samples: list[tuple[float, dict]],
    since: float | None = None,
    until: float | None = None,
) -> dict:
    """The longest stretch a live job had no lease holder (from EXCLUDE_AFTER_LAUNCH_S after its
    creation, within [since, until] when given): {max_s, job, at, jobs_over_1s, job_seconds}."""
    worst = (0.0, None, None)
    over_1s = set()
    total = 0.0
    for index, job in enumerate(job_keys):
        live = liveness(status_samples, job)
        start = last = None
        for at, holders in lease_samples:
            if at < created_at[job] + EXCLUDE_AFTER_LAUNCH_S:
                continue
            if (since is not None and at < since) or (until is not None and at > until):
                continue
            unheld = holders[index] is None and live(at)
            if unheld:
                if start is None:
                    start = at
                last = at
                continue
            if start is not None:
                # Held again: the stretch lasted until this sample.
                length = at - start if live(at) else last - start + SAMPLE_S
                total += length
                if length > 1.0:
                    over_1s.add(job)
                if length > worst[0]:
                    worst = (length, job, start)
                start = None
        if start is not None:
            length = last - start + SAMPLE_S
            total += length
            if length > 1.0:
                over_1s.add(job)
            if length > worst[0]:
                worst = (length, job, start)
    return {
        "max_s": round(worst[0], 2),
        "job": worst[1],
        "at": worst[2],
        "jobs_over_1s": len(over_1s),
        "job_seconds": round(total, 1),
    }


def names_pid(owner: str | None, pid: int) -> bool:
    """Whether a controller's name (or a lease token holding it), `host:pid:nonce`
    (console.services.fleet.FleetController), names process `pid`."""
    return bool(owner) and f":{pid}:" in owner


def takeover(
    lease_samples: list[tuple[float, list]],
    job_keys: list[str],
    kill_at: float,
    pid: int,
    holders_before: dict[str, str | None],
    status_samples: list[tuple[float, dict]],
) -> dict:
    """How long after the kill every job the killed controller held was held by another."""
    dead = {job: tok for job, tok in holders_before.items() if names_pid(tok, pid)}
    method = "lease token names the pid"
    index = {job: i for i, job in enumerate(job_keys)}
    after = [(t, h) for t, h in lease_samples if t >= kill_at]
    if not dead:
        # Tokens without the pid (redis-py locks): the leases nobody renewed after the kill,
        # left to expire LEASE_S later, are the dead controller's.
        method = "leases left to expire after the kill"
        for job, token in holders_before.items():
            if not token:
                continue
            i = index[job]
            gone = next(((t, h[i]) for t, h in after if h[i] != token), None)
            expired = gone is not None and gone[1] is None
            if expired and kill_at + LEASE_S - 1.0 <= gone[0] <= kill_at + LEASE_S + 1.0:
                dead[job] = token
    dead_tokens = set(dead.values())
    waits, lost = [], []
    for job in sorted(dead):
        live = liveness(status_samples, job)
        i = index[job]
        taken = next((t for t, h in after if h[i] is not None and h[i] not in dead_tokens), None)
        if taken is None:
            if live(after[-1][0] if after else kill_at):
                lost.append(job)
            continue
        waits.append(taken - kill_at)
    return {
        "held": len(dead),
        "method": method,
        "takeover_s": None if lost else round(max(waits, default=0.0), 2),
        "p50_s": _round(percentile(waits, 50), 2),
        "not_taken_over": len(lost),
    }


# --- failure to action --------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    kind: str  # process or node
    at: float
    job: str
    stage: str
    replica_id: str
    role: str = ""


@dataclass(frozen=True)
class Action:
    at: float
    what: str  # start_replica, kill_replica, promote
    jobs: tuple[str, ...]
    stage: str  # "" for a kill (restart-all kills every stage of the job)
    node: str = ""
    replica_id: str = ""


def actions_of(queue_log, control_log) -> list[Action]:
    """The controller's commands that reached the edge: start_replica and kill_replica popped
    from a node queue (expired ones left out: they did nothing), promotes on control lists."""
    found = []
    for event in queue_log:
        if event.expired or event.refused or event.task not in QUEUE_ACTIONS:
            continue
        at = event.sent_at if event.sent_at is not None else event.at
        if event.task == tasks.START_REPLICA.name:
            found.append(
                Action(at, "start_replica", (event.job,), event.stage, event.node,
                       event.replica_id)
            )  # fmt: skip
        else:
            jobs = tuple(sorted({job for job, _ in event.candidates}))
            found.append(Action(at, "kill_replica", jobs, "", event.node, event.replica_id))
    for event in control_log:
        if event.command.get("cmd") == "promote":
            found.append(
                Action(event.at, "promote", (event.job,), event.stage, "", event.replica_id)
            )
    return sorted(found, key=lambda a: a.at)


@dataclass(frozen=True)
class Outage:
    """A controller process that could not act from `start` to `end` (math.inf: killed)."""

    pid: int
    start: float
    end: float


def unattended(
    lease_samples: list[tuple[float, list]],
    job_keys: list[str],
    outages: list[Outage],
    answer_s: float = 1.0,
) -> Callable[[str, float], bool]:
    """Whether a job had no live controller to answer a failure at a time: its lease had no
    holder at the sample before, or changed hands in the `answer_s` before (it was being taken
    over: its takeover is measured apart), or its holder (a controller owner names its pid:
    `host:pid:id`) was paused or killed at some moment of the `answer_s` that follows."""
    times = [t for t, _ in lease_samples]
    index = {job: i for i, job in enumerate(job_keys)}

    def check(job: str, at: float) -> bool:
        i = bisect.bisect_right(times, at) - 1
        if i < 0:
            return False
        holder = lease_samples[i][1][index[job]]
        if holder is None:
            return True
        # From the sample in force `answer_s` before: a different holder there or since.
        since = max(0, bisect.bisect_right(times, at - answer_s) - 1)
        if any(lease_samples[k][1][index[job]] != holder for k in range(since, i)):
            return True
        return any(
            names_pid(holder, o.pid) and o.start <= at + answer_s and at <= o.end for o in outages
        )

    return check


def first_answers(failures: list[Failure], actions: list[Action]) -> list[tuple]:
    """Each failure with its first answering action within ACTION_TIMEOUT_S (or None): a
    command for the same job, for the failed stage (a kill, which names no stage, for any)."""
    answered = []
    for failure in failures:
        first = next(
            (
                a
                for a in actions
                if a.at >= failure.at
                and failure.job in a.jobs
                and a.stage in ("", failure.stage)
                and a.at - failure.at <= ACTION_TIMEOUT_S
            ),
            None,
        )
        answered.append((failure, first))
    return answered


def match(failures: list[Failure], actions: list[Action], observed_until: float) -> dict:
    """Failure to action over `failures`: {p50, p99, max, count} in ms, the failures left
    unanswered (watched for ACTION_TIMEOUT_S before `observed_until`) and which kind of command
    came first."""
    delays, unanswered, by_action, answered = [], [], {}, []
    for failure, first in first_answers(failures, actions):
        if first is None:
            if failure.at + ACTION_TIMEOUT_S <= observed_until:
                unanswered.append(failure)
            continue
        delays.append(first.at - failure.at)
        answered.append((first.at - failure.at, failure))
        by_action[first.what] = by_action.get(first.what, 0) + 1
    result = summary_ms(delays)
    slowest = sorted(answered, key=lambda pair: -pair[0])[:5]
    result.update(
        unanswered=len(unanswered),
        first_action=by_action,
        unanswered_examples=[f"{f.job}/{f.replica_id}@{f.at:.1f}" for f in unanswered[:5]],
        # To tell a slow answer's cause (a pause, a kill, a takeover) from the fault log.
        slowest_examples=[
            f"{f.job}/{f.replica_id}@{f.at:.1f}: {d * 1000:.0f} ms" for d, f in slowest
        ],
    )
    return result


# --- controller processes ---------------------------------------------------------------------


def process_figures(samples: list[ProcessSample], start: float, end: float, prefix: str) -> dict:
    """CPU (cores: CPU time over the window / its wall time) and RSS (MiB: the largest one
    process had, and the largest total at one sample) of the processes whose name starts with
    `prefix`, over [start, end]."""
    mine = [s for s in samples if s.name.startswith(prefix) and start <= s.at <= end]
    cpu = 0.0
    by_pid: dict[int, list[ProcessSample]] = {}
    for sample in mine:
        by_pid.setdefault(sample.pid, []).append(sample)
    for series in by_pid.values():
        first, last = series[0], series[-1]
        base = 0.0 if first.created > start else first.cpu_s
        cpu += last.cpu_s - base
    totals: dict[float, float] = {}
    for sample in mine:
        totals[sample.at] = totals.get(sample.at, 0.0) + sample.rss_mb
    wall = max(1e-9, end - start)
    return {
        "cpu_cores": round(cpu / wall, 3) if mine else None,
        "rss_mb": round(max((s.rss_mb for s in mine), default=0.0), 1) if mine else None,
        "rss_mb_total": round(max(totals.values(), default=0.0), 1) if mine else None,
        "processes": len(by_pid),
    }


def own_cpu_s() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


# --- database and Redis load ------------------------------------------------------------------


def db_method() -> str | None:
    """How database queries can be counted here: pg_stat_statements, pg_stat_database, or None
    (not PostgreSQL)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'")
        if cursor.fetchone() is None:
            return "pg_stat_database"
        try:
            cursor.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
        except DatabaseError:
            return "pg_stat_database"
    return "pg_stat_statements"


# PostgreSQL checks each inserted row's foreign keys with a statement of its own
# (`SELECT 1 FROM ONLY "public"."console_job" x WHERE "id" = $1 FOR KEY SHARE OF x`), which
# pg_stat_statements lists as a top-level statement although no client sent it: one per
# inserted row, part of the INSERT the client sent. They are left out of the query counts.
NOT_A_CONSTRAINT_CHECK = "query NOT LIKE '%FOR KEY SHARE OF x%'"


def db_counters(method: str | None) -> dict:
    """Queries (pg_stat_statements) and transactions (pg_stat_database) so far in this
    database; the statements reading these counters are left out."""
    if method is None:
        return {}
    out = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        out["transactions"] = int(cursor.fetchone()[0])
        if method == "pg_stat_statements":
            cursor.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                f"AND query NOT ILIKE '%pg_stat_%' AND {NOT_A_CONSTRAINT_CHECK}"
            )
            out["queries"] = int(cursor.fetchone()[0])
    return out


def statement_calls(method: str | None) -> dict[str, tuple[int, str]]:
    """queryid -> (calls so far, the statement's text) in this database (pg_stat_statements)."""
    if method != "pg_stat_statements":
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queryid::text, calls, query FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            f"AND query NOT ILIKE '%pg_stat_%' AND {NOT_A_CONSTRAINT_CHECK}"
        )
        return {queryid: (int(calls), query) for queryid, calls, query in cursor.fetchall()}


def top_statements(before: dict, after: dict, seconds: float, count: int = 10) -> list[dict]:
    """The statements called most often between two `statement_calls` readings, per second."""
    deltas = [
        (calls - before.get(queryid, (0, ""))[0], query)
        for queryid, (calls, query) in after.items()
    ]
    deltas.sort(key=lambda item: item[0], reverse=True)
    return [
        {"per_s": round(calls / seconds, 2), "query": " ".join(query.split())[:160]}
        for calls, query in deltas[:count]
        if calls > 0
    ]


def redis_counters(client) -> dict:
    stats = client.info("stats")
    cpu = client.info("cpu")
    commands = client.info("commandstats")
    return {
        "total": int(stats["total_commands_processed"]),
        "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        "commands": {name.removeprefix("cmdstat_"): v["calls"] for name, v in commands.items()},
    }


def row_counts() -> dict[str, int]:
    """Rows of every table of the console's models."""
    return {
        model._meta.db_table: model._default_manager.count()
        for model in apps.get_app_config("console").get_models()
    }
