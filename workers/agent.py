"""Node agent: a Celery worker consuming `node.<name>` that starts, stops, kills, pauses and
stresses the stage processes of its node, and publishes the node's heartbeat and metrics.

Run one per node with `BACKSTOP_NODE=<name>` and `--pool solo`: the solo pool runs tasks in the
worker's main process, so the Popen handles of the stage processes live next to the monitor
thread that reaps them and reports their exits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import redis
from celery import shared_task
from celery.signals import worker_ready, worker_shutting_down
from django.conf import settings

from console.policy.fault_params import (
    DEFAULT_MAX_DURATION_S,
    KILL_EXECUTOR,
    KILL_WORKER,
    PAUSE_NODE,
    STRESS_NODE,
    FaultParamsError,
    Limits,
    validate_params,
)
from console.redis import redis_client
from infra import keys, tasks
from infra.node_metrics import (
    PROCESSES,
    Capacity,
    NodeSampler,
    host_identity,
    machine_identity,
)
from infra.processes import (
    CPU_HOG_MODULE,
    SPARE_MODULE,
    STAGE_MODULE,
    argv_of,
    cmdline_arg,
    processes_matching,
    stage_processes,
)
from spark_runtime import keys as data_keys
from spark_runtime.activity import ActivityMeter, is_busy, tree_rss_mb
from spark_runtime.class_sharing import ensure_archive
from spark_runtime.command_fence import FenceMemory, check_command
from spark_runtime.config import stage_env_overrides
from spark_runtime.env import env

# SPARE_START_TIMEOUT_S: a spare not idle within it is replaced; its clock restarts while the
# spare yields its CPU (spark_runtime.spare.mark_yielding).
from spark_runtime.generators import generator_replica_id
from spark_runtime.launch import start_stage_process
from spark_runtime.spare import (
    SPARE_START_TIMEOUT_S,
    hold_spare_refills,
    release_warmup_lock,
    take_warmup_lock,
)

log = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 1.0
# How often the agent looks for replica processes that ended. Exits used to go out with the
# heartbeat, once a second: a killed primary's standby was promoted 0.9 s after the kill, most of
# adaptive's 1.1 s output gap (docs/RESULTS.md). A poll of a few children costs nothing.
EXIT_POLL_S = 0.1
HEARTBEAT_TTL_S = 5
LOG_TAIL_LINES = 30
# Only these entry points (module, required first argument) may be started through the queue:
# a task message must never be able to run an arbitrary command on a node.
ALLOWED_ENTRY_POINTS = {STAGE_MODULE: None, "spark_runtime": "generate"}

# A replica of the agent's children: (job key, replica id). Replica ids are unique only within
# a job (every restart-all job's one replica is `job-1`): two jobs on one node must not take each
# other's process for their own. A warm spare not yet handed a replica is ("", spare id).
ChildKey = tuple[str, str]
# (job key, replica id) -> (process, job key, log path), for the processes this agent started.
_children: dict[ChildKey, tuple[subprocess.Popen, str, Path]] = {}
_children_lock = threading.Lock()
# Replicas handed to a spare that was still warming up, and that spare's id. The spare holds the
# machine's warm-up lock until it is warm; its entry, for which reconcile_spares would release
# the lock, is gone, so the lock is released when the replica's process ends (a no-op when the
# spare released it itself).
_taken_while_warming: dict[ChildKey, str] = {}
# When each replica's process became that replica (started cold, or a spare handed it), by this
# node's clock: its exit report carries it, so the controller can tell the exit of a replica's
# previous run, reported after the replica was started again, from the run it asked for.
_became_replica_at: dict[ChildKey, float] = {}
# The pid of each replica's process this agent last sent SIGKILL: a start of that replica that
# follows (a restart is a kill, then a start) must not take that process for the replica.
_killed: dict[ChildKey, int] = {}
_stop = threading.Event()
# The newest lease tenure this agent saw per job: a controller's command of an older one is
# refused (spark_runtime.command_fence).
_fence = FenceMemory()


def this_node() -> str:
    """The node this agent serves (env BACKSTOP_NODE); tasks for other nodes are refused."""
    node = env("BACKSTOP_NODE", "")
    if not node:
        raise RuntimeError("BACKSTOP_NODE is not set: this worker is not a node agent")
    return node


def stage_log_path(replica_id: str, job_key: str = "") -> Path:
    """The log of a replica (`var/log/stages/{job}/{replica}.log`: replica ids repeat across
    jobs) or, without a job, of a warm spare (`var/log/stages/{spare}.log`; it keeps writing
    there after it becomes a replica)."""
    return settings.VAR_DIR / "log" / "stages" / job_key / f"{replica_id}.log"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64_000))
            return "\n".join(handle.read().decode(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def find_replica_process(replica_id: str, job_key: str | None) -> psutil.Process | None:
    """The live process (stage or generator) running replica `replica_id` of job `job_key` on
    this machine, if any, found by its command line (both carry `--job` and `--replica-id`).
    Replica ids repeat across jobs: `job_key` None (a kill message from a controller older than
    the job key) matches that id in any job."""
    found = processes_matching(
        lambda argv: (
            any(module in argv for module in ALLOWED_ENTRY_POINTS)
            and cmdline_arg(argv, "--replica-id") == replica_id
            and (job_key is None or cmdline_arg(argv, "--job") == job_key)
        )
    )
    return found[0] if found else None


def _handed_child(replica_id: str, job_key: str | None) -> subprocess.Popen | None:
    """The live child this agent started for (`job_key`, `replica_id`) (any job's when None)."""
    with _children_lock:
        for (key, child_id), (popen, _job, _path) in _children.items():
            if child_id != replica_id or not key or job_key not in (None, key):
                continue
            if popen.poll() is None:
                return popen
    return None


def running_replica(replica_id: str, job_key: str | None) -> psutil.Process | None:
    """The live process of replica `replica_id` of job `job_key` on this machine (any job's
    when None, see `find_replica_process`): found by its command line, or else the warm spare
    this agent handed it to, which takes the replica's command line only once it reads its
    command (a spare idling at nice 19 on busy cores took over 260 ms: a kill in between missed
    it, and the spare went on to fence the standby just promoted). Only spares this agent
    process started are known so: one left by an agent that restarted is found once it has
    taken the command line."""
    proc = find_replica_process(replica_id, job_key)
    if proc is not None:
        return proc
    popen = _handed_child(replica_id, job_key)
    if popen is None:
        return None
    try:
        return psutil.Process(popen.pid)
    except psutil.NoSuchProcess:
        return None


def node_stage_processes(job_key: str | None = None) -> list[psutil.Process]:
    """This node's stage processes (of one job when given), found by command line, with the
    spares this agent handed a replica that have not taken its command line yet (see
    `running_replica`): a node kill or pause must reach those too. A job's input generator is
    not one: it stands for the source outside the job (a producer, a broker), which a node of
    the job going down leaves running."""
    procs = stage_processes(node=this_node(), job=job_key)
    found = {proc.pid for proc in procs}
    with _children_lock:
        handed = [
            popen.pid
            for (key, replica_id), (popen, _job, _path) in _children.items()
            if key
            and job_key in (None, key)
            and replica_id != generator_replica_id(key)
            and popen.pid not in found
            and popen.poll() is None
        ]
    for pid in handed:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    return procs


# A SIGKILLed stage is gone within this long. The kill waits for it, and a start never takes
# a pid the kill was for (`_killed`): a restart of a live replica is a kill, then a start, of
# the same replica id on its node, ~50 ms apart, and a start that found the process still
# dying (this agent's own child not reaped yet, its command line already unreadable) took it
# for the replica (start_replica is idempotent). Nothing started, and the restart waited for
# the supervisor's start-up grace: 91-94 s of output gap in the benchmark's stop-and-restart
# upgrades.
KILLED_GONE_WITHIN_S = 10.0


def wait_gone(proc: psutil.Process, timeout_s: float) -> bool:
    """Wait until `proc` has exited (a zombie waiting to be reaped counts as gone: its reaper
    reports its exit); False if it still runs after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def _signal_group(proc: psutil.Process, sig: int) -> None:
    """Signal the process group of a stage (its Python driver and the JVM it launched)."""
    try:
        os.killpg(os.getpgid(proc.pid), sig)
    except ProcessLookupError:
        return


@shared_task(**tasks.START_REPLICA.options())
def start_replica(
    module: str,
    args: list[str],
    replica_id: str,
    job_key: str,
    warm: bool = False,
    lease: str | None = None,
) -> int:
    """Start `python -m module args...` for replica `replica_id` of job `job_key`; return its
    pid. With `warm`, a stage replica takes over an idle warm spare of this node when there is
    one (no JVM start). `lease`: the token of the sending controller's lease on the job; a
    start whose lease the job no longer holds is refused (0 returned, the refusal reported).

    Idempotent: when a process for that replica of that job is already running, its pid is
    returned (another job's replica of the same id is another replica).
    """
    if module not in ALLOWED_ENTRY_POINTS or ALLOWED_ENTRY_POINTS[module] not in (None, args[0]):
        raise ValueError(f"{module} {args[:1]} may not be started by a node agent")
    if not job_key:
        raise ValueError("a replica is started for a job: job_key is empty")
    if (
        cmdline_arg(args, "--job") != job_key
        or cmdline_arg(args, "--replica-id") != replica_id
        or cmdline_arg(args, "--node") != this_node()
    ):
        raise ValueError(
            "args must carry this replica's --job and --replica-id and this node's --node"
        )
    if not obeyed(job_key, lease, f"start {replica_id}"):
        return 0
    existing = running_replica(replica_id, job_key)
    with _children_lock:
        killed = _killed.pop((job_key, replica_id), None)
    if existing is not None and existing.pid == killed:
        # The process this agent was just told to kill, found while it dies: a restart.
        log.info("%s of %s: pid %s was killed; starting it anew", replica_id, job_key, killed)
        if not wait_gone(existing, KILLED_GONE_WITHIN_S):
            raise RuntimeError(f"{replica_id} of {job_key} (pid {killed}) survived its SIGKILL")
    elif existing is not None:
        return existing.pid
    if warm and module == STAGE_MODULE:
        pid = hand_to_spare(args, replica_id, job_key)
        if pid is not None:
            return pid
    path = stage_log_path(replica_id, job_key)
    # Its own session: killing the group takes the JVM too, and an agent restart does not take
    # the stage down; the data plane's variables only (never the console's secrets).
    proc = start_stage_process(
        module, args, path, env_overrides=stage_env_overrides(settings.REDIS_URL)
    )
    with _children_lock:
        _children[(job_key, replica_id)] = (proc, job_key, path)
        _became_replica_at[(job_key, replica_id)] = time.time()
    log.info("started %s of %s pid %s on %s", replica_id, job_key, proc.pid, this_node())
    return proc.pid


def obeyed(job_key: str, lease: str | None, command: str) -> bool:
    """Whether to carry out a controller's `command` for `job_key` sent under `lease`: only
    while the job's lease still holds it (spark_runtime.command_fence); a refusal is logged and
    put on the refused-commands stream."""
    if lease is None:
        return True
    with redis_client() as client:
        verdict = check_command(client, _fence, job_key, lease, f"agent {this_node()}", command)
    return verdict.accepted


# --- warm spares ---------------------------------------------------------------------------


def _spare_entries(client, node: str) -> dict[str, dict]:
    return {k: json.loads(v) for k, v in client.hgetall(data_keys.spares(node)).items()}


def _is_spare_process(pid: int, spare_id: str) -> bool:
    try:
        cmdline = argv_of(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return SPARE_MODULE in cmdline and cmdline_arg(cmdline, "--spare-id") == spare_id


def spares_to_take(entries: dict[str, dict], now: float) -> list[str]:
    """The spares of a node that may take a replica, best first: idle ones, then ones still
    warming up, the furthest along first (a spare whose start hung is left to reconcile_spares).
    A warming spare is taken rather than a cold process started beside it: the two JVM starts
    would share the cores, and the cold one starts from nothing."""
    idle = sorted(spare_id for spare_id, e in entries.items() if e.get("state") == "idle")
    warming = sorted(
        (e.get("since", now), spare_id)
        for spare_id, e in entries.items()
        if e.get("state") == "starting" and now - e.get("since", now) <= SPARE_START_TIMEOUT_S
    )
    return idle + [spare_id for _since, spare_id in warming]


def hand_to_spare(args: list[str], replica_id: str, job_key: str) -> int | None:
    """Give replica `replica_id` of job `job_key` (stage CLI `args`) to a warm spare of this
    node, idle or else still warming up (`spares_to_take`); returns the spare's pid, or None
    when this node has no spare (the caller starts a cold process). The spare, known until now
    as ("", spare id), is from here on that (job, replica)."""
    node = this_node()
    client = redis_client()
    entries = _spare_entries(client, node)
    for spare_id in spares_to_take(entries, time.time()):
        entry = entries[spare_id]
        if not _is_spare_process(entry["pid"], spare_id):
            continue
        # HDEL answers 1 to one taker only: the spare is ours from here on.
        if not client.hdel(data_keys.spares(node), spare_id):
            continue
        command = {"cmd": "become", "args": args}
        client.rpush(data_keys.spare_control(node, spare_id), json.dumps(command))
        # Taken here, not at the controller's next cycle: this node's next reconcile would
        # otherwise start the replacement spare at once, beside the catching-up replica.
        hold_spare_refills(client)
        with _children_lock:
            entry_proc = _children.pop(("", spare_id), None)
            if entry_proc is not None:
                _children[(job_key, replica_id)] = (entry_proc[0], job_key, entry_proc[2])
                _became_replica_at[(job_key, replica_id)] = time.time()
            if entry["state"] == "starting":
                _taken_while_warming[(job_key, replica_id)] = spare_id
        state, pid = entry["state"], entry["pid"]
        log.info("%s spare %s (pid %s) becomes %s of %s", state, spare_id, pid, replica_id, job_key)
        return int(entry["pid"])
    return None


def reconcile_spares(client, node: str) -> None:
    """Keep as many warm spares on this node as the controller wants: forget dead ones, replace
    ones whose start hung, start one more or stop one extra per call (no bursts). While refills
    are held (`hold_spare_refills`) none is started; none is stopped for it either."""
    wanted = int(client.get(data_keys.spares_wanted(node)) or 0)
    entries = _spare_entries(client, node)
    now = time.time()
    live = []
    for spare_id, entry in entries.items():
        stuck = (
            entry.get("state") != "idle" and now - entry.get("since", now) > SPARE_START_TIMEOUT_S
        )
        if not _is_spare_process(entry["pid"], spare_id) or stuck:
            # Only the one whose HDEL succeeds acts: `hand_to_spare` may have taken the spare
            # (and the process taken its replica's command line) since the entries were read.
            if not client.hdel(data_keys.spares(node), spare_id):
                continue
            release_warmup_lock(client, machine_identity(), spare_id)
            if stuck:
                with contextlib.suppress(psutil.NoSuchProcess):
                    _signal_group(psutil.Process(entry["pid"]), signal.SIGKILL)
            continue
        live.append(spare_id)
    if len(live) < wanted:
        if client.exists(data_keys.spare_refill_hold()):
            return
        spare_id = f"spare-{node}-{int(time.time() * 1000)}"
        # One warm-up at a time per machine (spark_runtime/spare.py): else try next time.
        if take_warmup_lock(client, machine_identity(), spare_id, SPARE_START_TIMEOUT_S):
            start_spare(client, node, spare_id)
    elif len(live) > wanted:
        extra = sorted(live)[-1]
        if client.hdel(data_keys.spares(node), extra):  # not taken meanwhile
            client.rpush(data_keys.spare_control(node, extra), json.dumps({"cmd": "stop"}))


def start_spare(client, node: str, spare_id: str) -> int:
    """Start warm spare `spare_id` on this node; returns its pid."""
    path = stage_log_path(spare_id)
    args = ["--node", node, "--machine", machine_identity(), "--spare-id", spare_id,
            "--redis-url", settings.REDIS_URL]  # fmt: skip
    proc = start_stage_process(
        SPARE_MODULE, args, path, env_overrides=stage_env_overrides(settings.REDIS_URL)
    )
    # Registered here too, so a spare that dies while starting is noticed and replaced.
    entry = {"pid": proc.pid, "state": "starting", "since": time.time()}
    client.hset(data_keys.spares(node), spare_id, json.dumps(entry))
    with _children_lock:
        _children[("", spare_id)] = (proc, "", path)
    log.info("started warm spare %s pid %s", spare_id, proc.pid)
    return proc.pid


def idle_spares(client, node: str) -> int:
    """How many warm spares of `node` are idle (reported with the node's metrics)."""
    return sum(1 for e in _spare_entries(client, node).values() if e.get("state") == "idle")


@shared_task(**tasks.START_GENERATOR.options())
def start_generator(
    job_key: str,
    topology: str,
    rate: float,
    seed: int = 0,
    count: int | None = None,
    lease: str | None = None,
) -> int:
    """Start the seeded input generator of a job at `rate` entries/s (`count` entries, or until
    stopped); return its pid (0: refused, `lease` no longer the job's). Idempotent: a running
    generator is left alone, and a new one resumes after the entries already in the input
    stream."""
    replica_id = generator_replica_id(job_key)
    args = [
        "generate", "--job", job_key, "--topology", topology, "--rate", str(float(rate)),
        "--seed", str(int(seed)), "--redis-url", settings.REDIS_URL,
        "--replica-id", replica_id, "--node", this_node(), "--resume",
    ]  # fmt: skip
    if count is not None:
        args += ["--count", str(int(count))]
    return start_replica(
        module="spark_runtime", args=args, replica_id=replica_id, job_key=job_key, lease=lease
    )


@shared_task(**tasks.KILL_REPLICA.options())
def kill_replica(
    replica_id: str,
    signal_name: str = "SIGKILL",
    job_key: str | None = None,
    lease: str | None = None,
) -> bool:
    """Send `signal_name` to the process group of replica `replica_id` of job `job_key`; False
    when it was not running, or when `lease` (the sending controller's token) is no longer the
    job's (the refusal reported). Another job's replica of the same id is left alone.

    A message without a job key was queued by a controller older than it (during an upgrade):
    it is carried out as that controller meant it then, on the first process of that replica id
    in any job, with a warning (with two jobs of that id on the node it may hit the wrong one).
    """
    if not job_key:
        log.warning(
            "kill_replica of %s names no job (an older controller's message): killing the "
            "first process of that replica id, of whichever job",
            replica_id,
        )
        job_key = None
    elif not obeyed(job_key, lease, f"kill {replica_id}"):
        return False
    proc = running_replica(replica_id, job_key)
    if proc is None:
        return False
    sig = signal.Signals[signal_name]
    if sig == signal.SIGKILL and job_key:
        with _children_lock:
            _killed[(job_key, replica_id)] = proc.pid
    _signal_group(proc, sig)
    log.info("sent %s to %s of %s (pid %s)", signal_name, replica_id, job_key, proc.pid)
    if sig == signal.SIGKILL and not wait_gone(proc, KILLED_GONE_WITHIN_S):
        log.warning("%s of %s (pid %s) still runs %s s after SIGKILL", replica_id, job_key,
                    proc.pid, KILLED_GONE_WITHIN_S)  # fmt: skip
    return True


@shared_task(**tasks.KILL_NODE.options())
def kill_node(job_key: str | None = None) -> list[int]:
    """SIGKILL every stage process of this node (of one job, when given); return their pids."""
    procs = node_stage_processes(job_key)
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
    return [p.pid for p in procs]


SPARK_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
SPARK_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def spark_executors(app_id: str) -> list[psutil.Process]:
    """The executor processes of Spark application `app_id` on this host, by executor id (an
    executor's command line names its application and id)."""
    found = []
    executors = processes_matching(
        lambda argv: SPARK_EXECUTOR_CLASS in argv and cmdline_arg(argv, "--app-id") == app_id
    )
    for proc in executors:
        executor_id = cmdline_arg(argv_of(proc.info["cmdline"]), "--executor-id") or ""
        found.append((int(executor_id) if executor_id.isdigit() else 0, proc))
    return [proc for _, proc in sorted(found, key=lambda pair: pair[0])]


def spark_worker_of(executor: psutil.Process) -> psutil.Process | None:
    """The Spark worker that launched `executor` (its parent process), if it is one."""
    with contextlib.suppress(psutil.Error):
        parent = executor.parent()
        if parent is not None and SPARK_WORKER_CLASS in parent.cmdline():
            return parent
    return None


def report_agent_event(kind: str, fault: str, detail: str, fault_id, job_key) -> None:
    """Tell the controller what became of a fault task (`keys.EVENT_REFUSED` or
    `keys.EVENT_SPARK_KILLED`) on the agent events stream; it reads the job's entries every
    tick."""
    with contextlib.suppress(redis.RedisError):
        redis_client().xadd(
            keys.agent_events(),
            {"kind": kind, "node": this_node(), "fault": fault, "detail": detail,
             "fault_id": str(fault_id or ""), "job": job_key or "", "at": str(time.time())},
            maxlen=keys.AGENT_EVENTS_MAXLEN,
            approximate=True,
        )  # fmt: skip


def spark_apps_of(procs: list[psutil.Process]) -> list[str]:
    """The Spark applications whose executors are among `procs`."""
    apps = set()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            cmdline = argv_of(proc.cmdline())
            if SPARK_EXECUTOR_CLASS in cmdline:
                apps.add(cmdline_arg(cmdline, "--app-id") or "?")
    return sorted(apps)


@shared_task(**tasks.KILL_SPARK_PROCESS.options())
def kill_spark_process(
    app_id: str, fault_kind: str, fault_id: int | None = None, job_key: str | None = None
) -> list[int]:
    """For fault `kill-executor`: SIGKILL the first executor of Spark application `app_id` on
    this host; for `kill-worker`: the Spark worker that runs it, with every executor it
    launched (a lost worker host: other applications' executors there go too). Returns the pids
    killed and reports the kill, or a refusal, on the agent events stream.

    Once per fault: a redelivered task (acks_late) finds the fault's mark and does nothing."""
    if fault_kind not in (KILL_EXECUTOR, KILL_WORKER):
        raise ValueError(f"fault_kind: {KILL_EXECUTOR} or {KILL_WORKER}, got {fault_kind!r:.40}")
    if fault_id is not None and not redis_client().set(
        keys.fault_carried_out(fault_id), this_node(), nx=True, ex=keys.FAULT_MARK_TTL_S
    ):
        log.info("fault %s was already carried out: nothing to do", fault_id)
        return []
    executors = spark_executors(app_id)
    victims = executors[:1]
    if fault_kind == KILL_WORKER and executors:
        worker = spark_worker_of(executors[0])
        try:
            victims = [worker, *worker.children(recursive=True)] if worker else []
        except psutil.Error:
            victims = []  # the worker ended meanwhile: nothing left to kill
    if not victims:
        what = "executor" if fault_kind == KILL_EXECUTOR else "Spark worker running an executor"
        detail = f"no {what} of Spark application {app_id} on {socket.gethostname()}"
        log.error("node %s refuses %s: %s", this_node(), fault_kind, detail)
        report_agent_event(keys.EVENT_REFUSED, fault_kind, detail, fault_id, job_key)
        return []
    apps = spark_apps_of(victims)
    killed = []
    for proc in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
            killed.append(proc.pid)
    what = "executor" if fault_kind == KILL_EXECUTOR else "worker"
    detail = f"killed Spark {what} of {app_id}: pids {killed}, executors of {', '.join(apps)}"
    log.info("node %s: %s", this_node(), detail)
    report_agent_event(keys.EVENT_SPARK_KILLED, fault_kind, detail, fault_id, job_key)
    return killed


class FaultRefusedByAgent(ValueError):
    """A fault task whose params this node does not accept (logged and reported, not run)."""


def agent_fault_limits() -> Limits:
    """This agent's own bounds for fault params: its node's cores and the configured maximum
    duration. The agent checks them again rather than trusting the task message."""
    max_duration = getattr(settings, "FAULT_MAX_DURATION_S", DEFAULT_MAX_DURATION_S)
    return Limits(max_duration_s=float(max_duration), cores=capacity_from_env().cpu_total)


def check_fault_params(
    kind: str, params: dict, fault_id: int | None = None, job_key: str | None = None
) -> dict:
    """`params` checked against this node's limits; a refusal is logged, reported on the agent
    events stream (kind `refused`, with the fault and job it was for, so the controller marks
    the fault refused) and raised as FaultRefusedByAgent."""
    try:
        return validate_params(kind, params, agent_fault_limits())
    except FaultParamsError as exc:
        node = this_node()
        log.error("node %s refuses %s: %s", node, kind, exc)
        report_agent_event(keys.EVENT_REFUSED, kind, str(exc), fault_id, job_key)
        raise FaultRefusedByAgent(f"{kind} refused by node {node}: {exc}") from exc


def pause_groups(client: redis.Redis, node: str, groups: list[int], duration_s: float) -> None:
    """SIGSTOP process `groups` and record in Redis when they must be resumed (now + duration).

    The deadline is written first: if the agent dies between the two steps, its successor still
    resumes the groups (a SIGCONT to a running group is harmless).
    """
    resume_at = time.time() + duration_s
    if groups:
        client.hset(
            keys.paused_groups(node),
            mapping={str(g): json.dumps({"resume_at": resume_at}) for g in groups},
        )
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGSTOP)


def resume_due(client: redis.Redis, node: str, now: float | None = None) -> list[int]:
    """SIGCONT every paused group of `node` whose deadline has passed; return those groups.

    Called every second by the agent loop and once when the agent starts, so pauses end on time
    even when the agent restarted while they ran.
    """
    now = time.time() if now is None else now
    resumed = []
    for group, entry in client.hgetall(keys.paused_groups(node)).items():
        if json.loads(entry)["resume_at"] > now:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(group), signal.SIGCONT)
        client.hdel(keys.paused_groups(node), group)
        resumed.append(int(group))
    if resumed:
        log.info("node %s resumed paused process groups %s", node, resumed)
    return resumed


@shared_task(**tasks.PAUSE_NODE.options())
def pause_node(
    duration_s: float, job_key: str | None = None, fault_id: int | None = None
) -> list[int]:
    """SIGSTOP this node's stage processes for `duration_s` seconds (a hang or partition).

    A timer in this agent sends the SIGCONT when the deadline kept in Redis has passed, and the
    agent loop checks the deadline every second too (see `resume_due`), so a restarted agent
    still resumes the groups.
    """
    checked = check_fault_params(PAUSE_NODE, {"duration_s": duration_s}, fault_id, job_key)
    node = this_node()
    procs = node_stage_processes(job_key)
    groups = sorted({os.getpgid(p.pid) for p in procs})
    pause_groups(redis_client(), node, groups, checked["duration_s"])
    # On time to the millisecond while this agent lives; the loop's check covers a restart.
    timer = threading.Timer(checked["duration_s"], _resume_due_quietly, args=(node,))
    timer.daemon = True
    timer.start()
    log.info("node %s paused groups %s for %g s", node, groups, checked["duration_s"])
    return groups


def _resume_due_quietly(node: str) -> None:
    try:
        resume_due(redis_client(), node)
    except redis.RedisError as exc:
        log.warning("node %s: could not resume paused groups now (the loop retries): %s", node, exc)


@shared_task(**tasks.STRESS_NODE.options())
def stress_node(
    duration_s: float, workers: int = 1, fault_id: int | None = None, job_key: str | None = None
) -> list[int]:
    """Start `workers` CPU hogs tagged with this node for `duration_s` seconds; return their pids.

    The hogs run the stage entry point's neighbour `workers.cpu_hog`, which exits on its own.
    The agent refuses more hogs than its node has cores and durations over the maximum.
    """
    checked = check_fault_params(
        STRESS_NODE, {"duration_s": duration_s, "workers": workers}, fault_id, job_key
    )
    pids = []
    for _ in range(checked["workers"]):
        # No log: a hog has nothing to say. No Redis either: it only burns CPU.
        proc = start_stage_process(CPU_HOG_MODULE, [str(checked["duration_s"]), this_node()], None)
        pids.append(proc.pid)
    return pids


def _report_exits(client: redis.Redis, node: str) -> None:
    """Reap children that ended and publish each exit with the tail of its log. A child is
    forgotten once its exit is published: a Redis error leaves the rest for the next call."""
    with _children_lock:
        ended = [
            (key, entry, _became_replica_at.get(key))
            for key, entry in _children.items()
            if entry[0].poll() is not None
        ]
    for child_key, entry, became_at in ended:
        proc, job_key, path = entry
        with _children_lock:
            warming_spare = _taken_while_warming.get(child_key)
        if warming_spare is not None:  # it died before it was warm
            release_warmup_lock(client, machine_identity(), warming_spare)
        if job_key:  # else a warm spare that ended before it became a replica
            _publish_exit(client, node, child_key[1], proc, job_key, path, became_at)
        with _children_lock:
            _taken_while_warming.pop(child_key, None)
            if _killed.get(child_key) == proc.pid:
                del _killed[child_key]  # gone: a start finds nothing to take for the replica
            if _children.get(child_key) is entry:
                del _children[child_key]
                _became_replica_at.pop(child_key, None)


def _publish_exit(
    client: redis.Redis,
    node: str,
    replica_id: str,
    proc,
    job_key: str,
    path,
    became_at: float | None,
):
    """Put the exit of replica `replica_id` of job `job_key` on the agents' events stream;
    `became_at`: when the process became that replica (`since`, "" if not known)."""
    client.xadd(
        keys.agent_events(),
        {
            "kind": keys.EVENT_EXIT,
            "node": node,
            "job": job_key,
            "replica_id": replica_id,
            "returncode": str(proc.returncode),
            "log_tail": log_tail(path),
            "at": str(time.time()),
            "since": "" if became_at is None else str(became_at),
        },
        maxlen=keys.AGENT_EVENTS_MAXLEN,
        approximate=True,
    )


# CPU of this agent's replica processes between two publish rounds (dead versus slow).
_activity = ActivityMeter()


def publish_activity(client: redis.Redis) -> None:
    """Publish, per job, how busy each replica process this agent started is: the controller
    reads it when a heartbeat is missing (a busy process is slow, not dead), and the policy
    scores operators from its averaged CPU and its memory."""
    with _children_lock:
        live = [
            (replica_id, proc.pid, job_key)
            for (job_key, replica_id), (proc, _job, _) in _children.items()
            if job_key and proc.poll() is None
        ]
    now = time.time()
    by_job: dict[str, dict[str, str]] = {}
    for replica_id, pid, job_key in live:
        share = _activity.cpu_share(pid)
        if share is not None:
            entry = {
                "cpu": round(share, 3),
                "cpu_avg": round(_activity.cpu_average(pid), 3),
                "rss_mb": round(tree_rss_mb(pid) or 0.0, 1),
                "busy": is_busy(share),
                "at": now,
            }
            by_job.setdefault(job_key, {})[replica_id] = json.dumps(entry)
    _activity.forget_others({pid for _, pid, _ in live})
    pipe = client.pipeline()
    for job_key, entries in by_job.items():
        pipe.hset(keys.replica_activity(job_key), mapping=entries)
        pipe.expire(keys.replica_activity(job_key), keys.ACTIVITY_TTL_S)
    pipe.execute()


def publish_forever(node: str, sampler: NodeSampler) -> None:
    """Heartbeat and metrics every second until the worker shuts down; survives Redis outages.
    The heartbeat names the agent's host: nodes on one host share its warm spares."""
    client = redis_client()
    host = host_identity()
    while not _stop.wait(PUBLISH_INTERVAL_S):
        try:
            resume_due(client, node)
            reconcile_spares(client, node)
            usage = {
                **sampler.sample().to_dict(),
                "spares": idle_spares(client, node),
                "host": host,
            }
            payload = json.dumps(usage)
            pipe = client.pipeline()
            pipe.set(keys.node_heartbeat(node), payload, ex=HEARTBEAT_TTL_S)
            pipe.xadd(
                keys.node_metrics(node),
                {"sample": payload},
                maxlen=keys.NODE_METRICS_MAXLEN,
                approximate=True,
            )
            pipe.execute()
            publish_activity(client)
        except redis.RedisError as exc:
            log.warning("node %s: could not publish to Redis: %s", node, exc)


def report_exits_forever(node: str) -> None:
    """Publish each replica process that ended, within EXIT_POLL_S, until the worker shuts
    down; an exit not published for want of Redis is published on a later round (the child
    stays listed until then)."""
    client = redis_client()
    while not _stop.wait(EXIT_POLL_S):
        try:
            _report_exits(client, node)
        except redis.RedisError as exc:
            log.warning("node %s: could not publish exits to Redis: %s", node, exc)


def capacity_from_env() -> Capacity:
    """The node's capacity: BACKSTOP_NODE_CPU / _MEM_MB / _DISK_MBPS / _BW_MBPS or the host's."""
    return Capacity(
        cpu_total=env("BACKSTOP_NODE_CPU", float(psutil.cpu_count() or 1), float),
        mem_total_mb=env("BACKSTOP_NODE_MEM_MB", psutil.virtual_memory().total / 2**20, float),
        disk_max_mbps=env("BACKSTOP_NODE_DISK_MBPS", 200.0, float),
        bw_total_mbps=env("BACKSTOP_NODE_BW_MBPS", 1000.0, float),
    )


@worker_ready.connect
def start_agent_loop(sender=None, **kwargs) -> None:
    """Begin publishing when this worker is a node agent (BACKSTOP_NODE set)."""
    node = env("BACKSTOP_NODE", None)
    if not node:
        return
    scope = env("BACKSTOP_NODE_SCOPE", PROCESSES)
    try:
        # Pauses that ended while no agent ran end now, not a loop interval later.
        resume_due(redis_client(), node)
    except redis.RedisError as exc:
        log.warning("node %s: could not read paused groups from Redis: %s", node, exc)
    try:
        # Once per machine: later stage JVMs share the classes a stage loads.
        ensure_archive(settings.REDIS_URL, stage_log_path("class-sharing"))
    except OSError as exc:
        log.warning("node %s: no class-data archive built: %s", node, exc)
    sampler = NodeSampler(node, capacity_from_env(), scope=scope)
    threading.Thread(
        target=publish_forever, args=(node, sampler), name=f"agent-{node}", daemon=True
    ).start()
    threading.Thread(
        target=report_exits_forever, args=(node,), name=f"agent-{node}-exits", daemon=True
    ).start()
    log.info("node agent %s publishing heartbeat and metrics (scope %s)", node, scope)


@worker_shutting_down.connect
def stop_agent_loop(**kwargs) -> None:
    _stop.set()
