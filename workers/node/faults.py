"""Node faults carried out by this agent: kill the node's stage processes, pause them (SIGSTOP
until a deadline kept in Redis), stress the node with CPU hogs, and kill a Spark executor or
worker. Each checks its params against this node's own limits again and reports what became of
it (refused, or the Spark processes killed) on the agent events stream."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time

import psutil
import redis
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
from infra import keys
from infra.processes import CPU_HOG_MODULE, argv_of, cmdline_arg, processes_matching
from spark_runtime.launch import start_stage_process
from workers.node import children
from workers.node.identity import capacity_from_env, this_node

log = logging.getLogger(__name__)

SPARK_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
SPARK_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class FaultRefusedByAgent(ValueError):
    """A fault task whose params this node does not accept (logged and reported, not run)."""


def kill_node(job_key: str | None = None) -> list[int]:
    """SIGKILL every stage process of this node (of one job, when given); return their pids."""
    procs = children.node_stage_processes(job_key)
    for proc in procs:
        children.signal_group(proc, signal.SIGKILL)
    return [p.pid for p in procs]


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


def kill_spark_process(
    app_id: str, fault_kind: str, fault_id: int | None = None, job_key: str | None = None
) -> list[int]:
    """For fault `kill-executor`: SIGKILL the first executor of Spark application `app_id` on
    this host; for `kill-worker`: the Spark worker that runs it, with every executor it
    launched (a lost worker host: other applications' executors there go too). Returns the pids
    killed and reports the kill, or a refusal, on the agent events stream.

    Once per fault: a redelivered task (acks_late) finds the fault's mark and does nothing."""
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
    procs = children.node_stage_processes(job_key)
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
