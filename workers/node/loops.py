"""The node agent's loops, each on a daemon thread from the worker's start until it shuts
down: the heartbeat and metrics every second (with the paused groups' deadlines, the warm
spares' reconcile and the replicas' activity), and the exits of children every EXIT_POLL_S."""

from __future__ import annotations

import json
import logging
import threading
import time

import psutil
import redis
from django.conf import settings

from console.redis import redis_client
from infra import keys
from infra.node_metrics import PROCESSES, NodeSampler, host_identity, machine_totals
from spark_runtime.activity import ActivityMeter, is_busy, tree_rss_mb
from spark_runtime.class_sharing import ensure_archive
from spark_runtime.env import env
from workers.node import children
from workers.node.faults import resume_due
from workers.node.identity import capacity_from_env
from workers.node.spares import idle_spares, reconcile_spares

log = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 1.0
# How often the agent looks for replica processes that ended. Exits used to go out with the
# heartbeat, once a second: a killed primary's standby was promoted 0.9 s after the kill, most of
# adaptive's 1.1 s output gap (docs/RESULTS.md). A poll of a few children costs nothing.
EXIT_POLL_S = 0.1
HEARTBEAT_TTL_S = 5
# Set when the worker shuts down: every loop ends at its next wait.
_stop = threading.Event()
# CPU of this agent's replica processes between two publish rounds (dead versus slow).
_activity = ActivityMeter()


def publish_activity(client: redis.Redis) -> None:
    """Publish, per job, how busy each replica process this agent started is: the controller
    reads it when a heartbeat is missing (a busy process is slow, not dead), and the policy
    scores operators from its averaged CPU and its memory."""
    live = children.live_replicas()
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
    The heartbeat names the agent's host (nodes on one host share its warm spares) and, when
    that host is the machine, the machine's cores and memory (the host reserve's capacity)."""
    client = redis_client()
    host = host_identity()
    totals = machine_totals()
    while not _stop.wait(PUBLISH_INTERVAL_S):
        try:
            resume_due(client, node)
            reconcile_spares(client, node)
            usage = {
                **sampler.sample().to_dict(),
                "spares": idle_spares(client, node),
                "host": host,
                **totals,
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
            children.report_exits(client, node)
        except redis.RedisError as exc:
            log.warning("node %s: could not publish exits to Redis: %s", node, exc)


def start(node: str) -> None:
    """Start node `node`'s agent: resume the pauses that ended while no agent ran, adopt the
    replicas an earlier run of it started, build the machine's class-data archive, then the
    publishing and exit threads."""
    scope = env("BACKSTOP_NODE_SCOPE", PROCESSES)
    client = redis_client()
    try:
        # Pauses that ended while no agent ran end now, not a loop interval later.
        resume_due(client, node)
    except redis.RedisError as exc:
        log.warning("node %s: could not read paused groups from Redis: %s", node, exc)
    try:
        # The replicas an earlier run of this agent started: their exits are reported too.
        children.adopt_running(client, node)
    except psutil.Error as exc:  # the process list could not be read: no adoption this run
        log.warning("node %s: adopted no running replica: %s", node, exc)
    try:
        # Once per machine: later stage JVMs share the classes a stage loads.
        ensure_archive(settings.REDIS_URL, children.stage_log_path("class-sharing"))
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


def stop() -> None:
    """End the loops at their next wait (the worker is shutting down)."""
    _stop.set()
