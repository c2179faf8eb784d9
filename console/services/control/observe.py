"""Observe: what runs. Node agents' heartbeats and usage, the exits they report, what
replicas say about themselves, warm spares, and the supervision state saved in Redis.

Reads Redis and keeps the database's view of nodes and replicas in step; starts nothing."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime

from django.utils import timezone

from console.clock import utc
from console.models import Job, MetricSample, Node, Policy, Replica
from console.policy.resources import node_score
from console.policy.strays import stray_candidates
from console.services import metrics
from console.services.control.fence import write_state
from console.services.faults import record_refusal, record_spark_kill
from infra import keys as control_keys
from infra import leases
from spark_runtime import keys as data_keys
from spark_runtime.replicas import PRIMARY, RUNNING, of_an_earlier_run
from spark_runtime.supervision import Supervisor

log = logging.getLogger(__name__)

NODE_HISTORY_SAMPLES = 20
# An agent publishes replica activity every second: older figures are not the replica's now.
USAGE_FRESH_S = 10.0


def parsed_entry(raw, what: str) -> dict | None:
    """A JSON object an agent or a replica wrote, or None (logged) when it is not one: one
    malformed entry is left out rather than failing the read of every node or job."""
    try:
        value = json.loads(raw)
    except (TypeError, ValueError) as exc:
        log.warning("%s is not JSON, left out: %s", what, exc)
        return None
    if not isinstance(value, dict):
        log.warning("%s is not a JSON object, left out: %.80r", what, value)
        return None
    return value


def alive_nodes(client) -> dict[str, dict]:
    """Nodes whose agent heartbeat is fresh, with their newest usage sample (a node whose
    heartbeat is malformed counts as silent). One query and one round trip."""
    names = list(Node.objects.values_list("name", flat=True))
    beats = client.mget([control_keys.node_heartbeat(name) for name in names]) if names else []
    result = {}
    for name, beat in zip(names, beats, strict=True):
        if beat is not None:
            usage = parsed_entry(beat, f"heartbeat of node {name}")
            if usage is not None:
                result[name] = usage
    return result


def node_history(client, names) -> dict:
    """node -> its recent samples as the policy's NodeSamples, newest first (malformed samples
    left out)."""
    history = {}
    recent = metrics.recent_node_usages(client, list(names), NODE_HISTORY_SAMPLES)
    for name, usages in recent.items():
        samples = []
        for usage in usages:
            try:
                samples.append(metrics.node_sample_from_usage(name, usage))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("a usage sample of node %s is malformed, left out: %r", name, exc)
        history[name] = samples
    return history


def stage_usage(client, job: Job, supervisor: Supervisor) -> dict[str, tuple[float, float]]:
    """stage -> (averaged CPU in cores, RSS in MiB) of its running primary's process tree, as
    its node agent last published it; stages without fresh figures are left out."""
    published = client.hgetall(control_keys.replica_activity(job.key))
    usage = {}
    for stage in supervisor.stages:
        for replica in supervisor.of_stage(stage, PRIMARY):
            raw = published.get(replica.spec.replica_id)
            if replica.state != RUNNING or raw is None:
                continue
            entry = json.loads(raw)
            fresh = time.time() - float(entry["at"]) < USAGE_FRESH_S
            if fresh and "cpu_avg" in entry and "rss_mb" in entry:
                usage[stage] = (float(entry["cpu_avg"]), float(entry["rss_mb"]))
    return usage


def update_nodes(client) -> dict[str, dict]:
    """Mark nodes up or down from their agents' heartbeats; store their new usage samples and
    their Q score (once for the fleet, not once per job: every job's cycle ranks the same
    nodes). A few queries whatever the number of nodes."""
    alive = alive_nodes(client)
    history = node_history(client, alive)
    config = Policy.current().to_config()
    now = timezone.now()
    rows, read = [], {}
    for node in Node.objects.filter(name__in=list(alive)):
        node_rows, read[node.name] = metrics.read_node_metrics(client, node)
        rows.extend(node_rows)
        if history.get(node.name):
            score = round(node_score(history[node.name], config), 4)
            rows.append(MetricSample(at=now, node=node, name="q_score", value=score))
    Node.objects.filter(name__in=list(alive)).update(state=Node.State.UP, last_heartbeat=now)
    Node.objects.exclude(name__in=list(alive)).exclude(state=Node.State.DOWN).update(
        state=Node.State.DOWN
    )
    metrics.store_node_metrics(client, rows, read)
    return alive


def spares_by_state(client, nodes: list[str]) -> dict[str, Counter]:
    """Warm spares per node and state (`idle`, `starting`: warming up), as the node agents
    report them now."""
    with client.pipeline(transaction=False) as pipe:
        for node in nodes:
            pipe.hvals(data_keys.spares(node))
        reported = pipe.execute()
    spares = {}
    for node, entries in zip(nodes, reported, strict=True):
        parsed = (parsed_entry(raw, f"a warm spare of node {node}") for raw in entries)
        spares[node] = Counter(entry.get("state") for entry in parsed if entry is not None)
    return spares


def read_agent_events(client, job: Job, launched_at: Mapping[str, float] | None = None) -> bool:
    """Read the job's new entries on the agents' events stream: copy process exits into the
    job's exits hash, mark the faults an agent refused, and open an episode for each Spark
    executor or worker an agent killed (the policy cycle fails such faults no agent reported
    on: `expire_unreported_spark_kills`). Returns whether an entry asks the job's controller
    to look at its upgrade (console.services.upgrades.wake).

    `launched_at`: when the supervisor last asked for each replica. The exit of a replica's
    earlier run read after its relaunch (a failed stage takes seconds to exit, and the restart
    does not wait for it) is left out: in the exits hash it said the new process had ended,
    and the supervisor counted a second failure and restarted the replica again."""
    cursor_key = control_keys.agent_events_cursor(job.key)
    cursor = client.get(cursor_key) or "0-0"
    entries = client.xrange(control_keys.agent_events(), min=f"({cursor}", count=1000)
    upgrade = False
    for _, fields in entries:
        if fields.get("job") != job.key:
            continue
        kind, fault_id = fields.get("kind"), fields.get("fault_id", "")
        if kind == control_keys.EVENT_UPGRADE:
            upgrade = True
        elif kind == control_keys.EVENT_EXIT:
            replica_id = fields["replica_id"]
            since, asked_at = fields.get("since"), (launched_at or {}).get(replica_id)
            if since and asked_at is not None and of_an_earlier_run(float(since), asked_at):
                continue
            client.hset(control_keys.exits(job.key), replica_id, json.dumps(fields))
            client.hset(control_keys.exit_tails(job.key), replica_id, fields["log_tail"])
        elif kind == control_keys.EVENT_REFUSED and fault_id.isdigit():
            record_refusal(job, fault_id, fields.get("detail", ""))
        elif kind == control_keys.EVENT_SPARK_KILLED and fault_id.isdigit():
            at = float(fields.get("at") or time.time())
            record_spark_kill(job, fault_id, fields.get("detail", ""), at)
    if entries:
        write_state(client, job.key, cursor_key, entries[-1][0], create=True)
    return upgrade


def unsupervised_jobs(client) -> list[int]:
    """The live jobs whose supervision lease nobody holds, by id."""
    live = dict(Job.objects.filter(status__in=Job.LIVE_STATUSES).values_list("key", "pk"))
    return [live[key] for key, holder in leases.holders(client, list(live)).items() if not holder]


# A replica row's last_heartbeat is written again when older than this even if nothing else
# about the replica changed (Redis holds the live heartbeat; the row is for the pages).
HEARTBEAT_ROW_REFRESH_S = 30.0
# The Replica columns sync_replicas copies from what a replica reports.
SYNCED_REPLICA_FIELDS = (
    "pid", "role", "fencing_epoch", "state", "checkpoint_interval_s", "interval_since", "nice",
    "batch_every_s", "last_heartbeat",
)  # fmt: skip


def sync_replicas(job: Job, client, supervisor: Supervisor) -> dict[str, dict]:
    """Copy what replicas report about themselves (pid, state, epoch, heartbeat, checkpoint
    interval, CPU priority and batch pace) into the DB; a replica the supervisor holds for slow
    (silent but busy) shows as such. One query reads the job's rows and one writes those that
    changed (none while nothing did but the heartbeat, refreshed every
    HEARTBEAT_ROW_REFRESH_S). Returns the replicas that beat but that the supervisor does not
    list (console.policy.strays): id -> their entry."""
    reported = client.hgetall(data_keys.replicas(job.key))
    if not reported:
        return {}
    ids = list(reported)
    with client.pipeline(transaction=False) as pipe:
        for replica_id in ids:
            pipe.exists(data_keys.heartbeat(job.key, replica_id))
        alive_by_id = dict(zip(ids, pipe.execute(), strict=True))
    entries = {replica_id: json.loads(raw) for replica_id, raw in reported.items()}
    strays = stray_candidates(entries, alive_by_id, supervisor.replicas)
    slow = set(supervisor.slow())
    rows = {
        row.replica_id: row
        for row in Replica.objects.filter(
            replica_id__in=[Replica.full_id(job.key, r) for r in ids]
        ).exclude(state__in=(Replica.State.FAILED, Replica.State.STOPPED))
    }
    now = datetime.now(tz=UTC)
    changed = []
    for replica_id, info in entries.items():
        row = rows.get(Replica.full_id(job.key, replica_id))
        if row is None:
            continue
        alive = bool(alive_by_id[replica_id])
        if replica_id in slow:
            state = Replica.State.SLOW
        elif not alive:
            state = Replica.State.STARTING
        else:
            state = {
                "running": Replica.State.RUNNING,
                "catching_up": Replica.State.CATCHING_UP,
                "starting": Replica.State.STARTING,
                "stopped": Replica.State.STOPPED,
            }.get(info.get("state"), Replica.State.FAILED)
        values = {
            "pid": info.get("pid"),
            "role": info.get("role", Replica.Role.PRIMARY),
            "fencing_epoch": info.get("epoch") or 0,
            "state": state,
            "checkpoint_interval_s": info.get("checkpoint_interval_s"),
            "interval_since": utc(info["interval_since"]) if info.get("interval_since") else None,
            "nice": info.get("nice"),
            "batch_every_s": info.get("batch_every_s"),
        }
        beat = utc(info["updated"]) if alive and info.get("updated") else None
        stale_beat = (beat is None) != (row.last_heartbeat is None) or (
            beat is not None
            and (now - row.last_heartbeat).total_seconds() >= HEARTBEAT_ROW_REFRESH_S
        )
        if stale_beat or any(getattr(row, name) != value for name, value in values.items()):
            for name, value in values.items():
                setattr(row, name, value)
            row.last_heartbeat = beat
            changed.append(row)
    if changed:
        Replica.objects.bulk_update(changed, SYNCED_REPLICA_FIELDS)
    return strays


def save_supervisor(client, job: Job, supervisor: Supervisor) -> None:
    client.set(control_keys.controller_state(job.key), json.dumps(supervisor.to_dict()))


def load_supervisor(client, job: Job) -> Supervisor | None:
    raw = client.get(control_keys.controller_state(job.key))
    return None if raw is None else Supervisor.from_dict(json.loads(raw))
