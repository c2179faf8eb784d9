"""Warm spare keeping on this node: as many spares as the controller wants (one more or fewer
per round, one warm-up per machine at a time), and the handing of a replica to the best of
them. A spare's entry lives in Redis (spark_runtime.keys.spares); its process is this agent's
child, or an earlier run's (workers/node/children.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import time

import psutil
from django.conf import settings

from console.redis import redis_client
from infra.node_metrics import machine_identity
from infra.processes import SPARE_MODULE, argv_of, cmdline_arg
from spark_runtime import keys as data_keys
from spark_runtime.config import stage_env_overrides
from spark_runtime.launch import start_stage_process

# SPARE_START_TIMEOUT_S: a spare not idle within it is replaced; its clock restarts while the
# spare yields its CPU (spark_runtime.spare.mark_yielding).
from spark_runtime.spare import (
    SPARE_START_TIMEOUT_S,
    hold_spare_refills,
    release_warmup_lock,
    take_warmup_lock,
)
from workers.node import children
from workers.node.identity import this_node

log = logging.getLogger(__name__)


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
        warming = entry["state"] == "starting"
        children.hand_over(spare_id, int(entry["pid"]), job_key, replica_id, warming=warming)
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
                    children.signal_group(psutil.Process(entry["pid"]), signal.SIGKILL)
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
    path = children.stage_log_path(spare_id)
    args = ["--node", node, "--machine", machine_identity(), "--spare-id", spare_id,
            "--redis-url", settings.REDIS_URL]  # fmt: skip
    proc = start_stage_process(
        SPARE_MODULE, args, path, env_overrides=stage_env_overrides(settings.REDIS_URL)
    )
    # Registered here too, so a spare that dies while starting is noticed and replaced.
    entry = {"pid": proc.pid, "state": "starting", "since": time.time()}
    client.hset(data_keys.spares(node), spare_id, json.dumps(entry))
    children.register_spare(spare_id, proc, path)
    log.info("started warm spare %s pid %s", spare_id, proc.pid)
    return proc.pid


def idle_spares(client, node: str) -> int:
    """How many warm spares of `node` are idle (reported with the node's metrics)."""
    return sum(1 for e in _spare_entries(client, node).values() if e.get("state") == "idle")
