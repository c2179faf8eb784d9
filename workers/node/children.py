"""The processes this node agent watches, and what becomes of them: the registry of its
children (replicas and warm spares, with their logs) and of the replica processes it adopted
(started by an earlier run of the agent), finding the process that runs a replica, killing one,
and reporting each exit with the tail of its log.

The registry lives in this module only (the solo pool runs tasks in the worker's main process,
so a child's Popen handle is here beside the thread that reaps it); the other modules of
workers/node change it through the functions below.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import redis
from django.conf import settings

from infra import keys
from infra.node_metrics import machine_identity
from infra.processes import (
    STAGE_MODULE,
    argv_of,
    cmdline_arg,
    processes_matching,
    stage_processes,
)
from spark_runtime import keys as data_keys
from spark_runtime.config import stage_env_overrides
from spark_runtime.generators import generator_replica_id
from spark_runtime.launch import start_stage_process
from spark_runtime.spare import release_warmup_lock
from workers.node.identity import this_node

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 30
# Only these entry points (module, required first argument) may be started through the queue:
# a task message must never be able to run an arbitrary command on a node.
ALLOWED_ENTRY_POINTS = {STAGE_MODULE: None, "spark_runtime": "generate"}

# A replica of the agent's children: (job key, replica id). Replica ids are unique only within
# a job (every restart-all job's one replica is `job-1`): two jobs on one node must not take each
# other's process for their own. A warm spare not yet handed a replica is ("", spare id).
ChildKey = tuple[str, str]
# A watched process: a child this agent process started (its Popen), or a replica process it
# adopted (psutil): one an earlier run of this node's agent started, found by its command line
# when this one started (`adopt_running`), or a warm spare of that earlier run handed a replica
# (`hand_over`). An adopted process is not this agent's child: its exit is seen, within the same
# poll, but only its parent learns its code. Unwatched, a killed replica was found by its missing
# heartbeat, 3 s later: the soak's slowest kill-driver recovery (docs/RESULTS.md).
Watched = subprocess.Popen | psutil.Process
# (job key, replica id) -> (process, job key, log path), for the processes this agent watches.
_children: dict[ChildKey, tuple[Watched, str, Path]] = {}
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

# A SIGKILLed stage is gone within this long. The kill waits for it, and a start never takes
# a pid the kill was for (`_killed`): a restart of a live replica is a kill, then a start, of
# the same replica id on its node, ~50 ms apart, and a start that found the process still
# dying (this agent's own child not reaped yet, its command line already unreadable) took it
# for the replica (start_replica is idempotent). Nothing started, and the restart waited for
# the supervisor's start-up grace: 91-94 s of output gap in the benchmark's stop-and-restart
# upgrades.
KILLED_GONE_WITHIN_S = 10.0


def stage_logs() -> Path:
    """The folder of the stage logs of this machine (`var/log/stages`)."""
    return settings.VAR_DIR / "log" / "stages"


def stage_log_path(replica_id: str, job_key: str = "") -> Path:
    """The log of a replica (`var/log/stages/{job}/{replica}.log`: replica ids repeat across
    jobs) or, without a job, of a warm spare (`var/log/stages/{spare}.log`; it keeps writing
    there after it becomes a replica)."""
    return stage_logs() / job_key / f"{replica_id}.log"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when it does not exist or cannot be read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64_000))
            return "\n".join(handle.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:  # gone, or not readable: the exit is reported without its log
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


def is_live(proc: Watched) -> bool:
    """Whether a watched process still runs (an exited child not yet reaped does not)."""
    if isinstance(proc, subprocess.Popen):
        return proc.poll() is None
    try:
        # is_running also tells a reused pid from the process adopted.
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it is there, only not ours to read


def _handed_child(replica_id: str, job_key: str | None) -> Watched | None:
    """The live process this agent watches as (`job_key`, `replica_id`) (any job's when None)."""
    with _children_lock:
        for (key, child_id), (proc, _job, _path) in _children.items():
            if child_id != replica_id or not key or job_key not in (None, key):
                continue
            if is_live(proc):
                return proc
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
    handed = _handed_child(replica_id, job_key)
    if handed is None:
        return None
    try:
        return psutil.Process(handed.pid)
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
            proc.pid
            for (key, replica_id), (proc, _job, _path) in _children.items()
            if key
            and job_key in (None, key)
            and replica_id != generator_replica_id(key)
            and proc.pid not in found
            and is_live(proc)
        ]
    for pid in handed:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    return procs


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


def signal_group(proc: psutil.Process, sig: int) -> None:
    """Signal the process group of a stage (its Python driver and the JVM it launched)."""
    try:
        os.killpg(os.getpgid(proc.pid), sig)
    except ProcessLookupError:
        return


def already_running(replica_id: str, job_key: str) -> int | None:
    """The pid of the process already running replica `replica_id` of job `job_key` (a start
    is idempotent), or None when one must be started: none runs, or the one found is the
    process this agent was just told to kill (a restart), waited for until it is gone."""
    existing = running_replica(replica_id, job_key)
    with _children_lock:
        killed = _killed.pop((job_key, replica_id), None)
    if existing is not None and existing.pid == killed:
        # The process this agent was just told to kill, found while it dies: a restart.
        log.info("%s of %s: pid %s was killed; starting it anew", replica_id, job_key, killed)
        if not wait_gone(existing, KILLED_GONE_WITHIN_S):
            raise RuntimeError(f"{replica_id} of {job_key} (pid {killed}) survived its SIGKILL")
        return None
    return None if existing is None else existing.pid


def start_child(module: str, args: list[str], replica_id: str, job_key: str) -> int:
    """Start `python -m module args...` as replica `replica_id` of job `job_key` from cold,
    logging to its stage log; register it as this agent's child and return its pid."""
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


def register_spare(spare_id: str, proc: subprocess.Popen, path: Path) -> None:
    """Register warm spare `spare_id` (not yet any replica) as this agent's child, so a spare
    that dies while starting is noticed and replaced."""
    with _children_lock:
        _children[("", spare_id)] = (proc, "", path)


def hand_over(spare_id: str, pid: int, job_key: str, replica_id: str, warming: bool) -> None:
    """Warm spare `spare_id` (process `pid`) is from here on replica `replica_id` of job
    `job_key`; `warming`: it was taken before it was warm (see `_taken_while_warming`). A spare
    an earlier run of this agent started is adopted (see `Watched`)."""
    with _children_lock:
        entry = _children.pop(("", spare_id), None)
        if entry is None:
            # A spare of this agent's earlier run, adopted; unless it died as it was handed
            # (then the replica misses its heartbeat).
            with contextlib.suppress(psutil.NoSuchProcess):
                entry = (psutil.Process(pid), job_key, stage_log_path(spare_id))
        if entry is not None:
            _children[(job_key, replica_id)] = (entry[0], job_key, entry[2])
            _became_replica_at[(job_key, replica_id)] = time.time()
        if warming:
            _taken_while_warming[(job_key, replica_id)] = spare_id


def kill(replica_id: str, signal_name: str, job_key: str | None) -> bool:
    """Send `signal_name` to the process group of replica `replica_id` of job `job_key` (any
    job's when None); False when it was not running. A SIGKILL is remembered, so the start
    that follows does not take the dying process for the replica, and waited for."""
    proc = running_replica(replica_id, job_key)
    if proc is None:
        return False
    sig = signal.Signals[signal_name]
    if sig == signal.SIGKILL and job_key:
        with _children_lock:
            _killed[(job_key, replica_id)] = proc.pid
    signal_group(proc, sig)
    log.info("sent %s to %s of %s (pid %s)", signal_name, replica_id, job_key, proc.pid)
    if sig == signal.SIGKILL and not wait_gone(proc, KILLED_GONE_WITHIN_S):
        log.warning("%s of %s (pid %s) still runs %s s after SIGKILL", replica_id, job_key,
                    proc.pid, KILLED_GONE_WITHIN_S)  # fmt: skip
    return True


def adopt_running(client: redis.Redis, node: str) -> list[ChildKey]:
    """Watch the replica processes of node `node` that this agent process did not start (an
    earlier run of the agent did: a replica outlives its agent's restart), as if they were its
    children. Each one's start as that replica is the `started_at` the process wrote in its
    replicas-hash entry (its exit report says which run ended), else its own start. Returns the
    (job, replica) adopted."""
    adopted = []
    for proc in stage_processes(node=node):
        argv = argv_of(proc.info["cmdline"])
        job_key, replica_id = cmdline_arg(argv, "--job"), cmdline_arg(argv, "--replica-id")
        if not job_key or not replica_id:
            continue  # a warm spare with no replica yet: spares.reconcile_spares keeps those
        try:
            became_at = _replica_started_at(client, job_key, replica_id, proc)
        except psutil.Error:
            continue  # gone meanwhile, or not ours to read
        with _children_lock:
            if (job_key, replica_id) in _children:
                continue  # this agent's own, or adopted already
            _children[(job_key, replica_id)] = (proc, job_key, _log_of(proc, job_key, replica_id))
            _became_replica_at[(job_key, replica_id)] = became_at
        adopted.append((job_key, replica_id))
        log.info("adopted %s of %s (pid %s) on %s", replica_id, job_key, proc.pid, node)
    return adopted


def _replica_started_at(client, job_key: str, replica_id: str, proc: psutil.Process) -> float:
    """When `proc` became replica `replica_id`: its own `started_at`, if its entry is its own
    (same pid), else (no such entry, one that cannot be read, or no Redis) when the process
    started."""
    try:
        raw = client.hget(data_keys.replicas(job_key), replica_id)
        entry = json.loads(raw) if raw else {}
        if entry.get("pid") == proc.pid and entry.get("started_at") is not None:
            return float(entry["started_at"])
    except (redis.RedisError, ValueError, TypeError, AttributeError) as exc:
        log.warning("%s of %s: its replica entry says nothing of its start: %s",
                    replica_id, job_key, exc)  # fmt: skip
    return proc.create_time()


def _log_of(proc: psutil.Process, job_key: str, replica_id: str) -> Path:
    """The log a process writes: its standard output if that is a stage log file (a spare's
    log, for a spare that became a replica), else the log a replica started cold writes. Only
    a file under the stage logs: a terminal or a pipe would block or fail the exit report."""
    with contextlib.suppress(OSError):
        path = Path(os.readlink(f"/proc/{proc.pid}/fd/1"))
        if path.is_relative_to(stage_logs()) and path.is_file():
            return path
    return stage_log_path(replica_id, job_key)


def live_replicas() -> list[tuple[str, int, str]]:
    """(replica id, pid, job key) of each live replica process this agent watches (not the
    spares that have no replica yet)."""
    with _children_lock:
        return [
            (replica_id, proc.pid, job_key)
            for (job_key, replica_id), (proc, _job, _) in _children.items()
            if job_key and is_live(proc)
        ]


def report_exits(client: redis.Redis, node: str) -> None:
    """Reap children that ended and publish each exit with the tail of its log (an adopted
    process's without its code). A process is forgotten once its exit is published: a Redis
    error leaves the rest for the next call."""
    with _children_lock:
        ended = [
            (key, entry, _became_replica_at.get(key))
            for key, entry in _children.items()
            if not is_live(entry[0])
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
    proc: Watched,
    job_key: str,
    path,
    became_at: float | None,
):
    """Put the exit of replica `replica_id` of job `job_key` on the agents' events stream;
    `became_at`: when the process became that replica (`since`, "" if not known). The
    `returncode` of an adopted process is "" (only its parent learns it)."""
    returncode = str(proc.returncode) if isinstance(proc, subprocess.Popen) else ""
    client.xadd(
        keys.agent_events(),
        {
            "kind": keys.EVENT_EXIT,
            "node": node,
            "job": job_key,
            "replica_id": replica_id,
            "returncode": returncode,
            "log_tail": log_tail(path),
            "at": str(time.time()),
            "since": "" if became_at is None else str(became_at),
        },
        maxlen=keys.AGENT_EVENTS_MAXLEN,
        approximate=True,
    )
