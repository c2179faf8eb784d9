"""Simulated node agents and stage processes, at the Redis edge the real ones speak.

One `FleetSim` plays every node agent and every stage replica of the fleet in this process, with
three threads and pipelined writes, so 50 nodes and over a thousand replicas cost a fraction of a
core:

- the queue thread pops the Celery messages the controller leaves on the node queues (BRPOP on
  the kombu Redis lists `node.<name>`, decoded as tests/agent_edge.py does) and carries them out
  as workers/agent.py does: start_replica, start_generator, kill_replica, kill_node (a message
  past its `expires` is dropped, as a Celery worker drops it);
- the control thread hears, through keyspace notifications, a command pushed to a replica's
  control list (`spark_runtime.keys.control`) the moment it lands (a real stage blocks on BLPOP)
  and obeys it as spark_runtime/stage.py does: promote (a new fencing epoch), demote (after its
  next batch: a standby, the promotion passed on to its successor, as an upgrade's blue does),
  stop, trigger, checkpoint_interval, fault;
- the beat thread writes, every 0.1 s, what is due: each replica's heartbeat and replicas-hash
  entry every 0.5 s (spark_runtime.stage.ReplicaState.publish), its progress records after each
  micro-batch (spark_runtime.progress), each node's heartbeat and usage sample every second
  (infra.node_metrics.NodeUsage, workers.agent.publish_forever), the replicas' activity, the
  warm spares the controller asks for, a trickle of input per generator, and the agents' exit
  events (workers.agent._publish_exit, within EXIT_POLL_S of the exit).

A controller's command carries its lease token (spark_runtime.command_fence): each simulated
agent and each simulated stage judges it with `check_command`, the function the real ones call,
with a FenceMemory of its own, and refuses (does not carry out) what the fence refuses. Apart
from the fence, every controller's command carried out is audited against the job's lease read
right after (`_audit`: stale when the lease holds neither its token nor the token released), and
a start of a replica id of a job while that replica runs on another node is a duplicate.

What a replica reports follows its simulated life: `starting` when its process boots, `running`
with its epoch once its (cold or warm) start is over, one batch per trigger after that. A primary
that finds its stage's fencing epoch moved on exits with code 3 at its next batch.

Which process a message names: replica ids (`{stage}-{n}`: every restart-all job's one replica
is `job-1`) repeat across jobs, so the agent knows a replica by its job and its id
(workers.agent.find_replica_process, running_replica), as the simulated one does: a start names
its job and is taken for done only when that job's replica runs; a kill names its job
(`job_key`) and ends only that job's process. A kill naming no job, queued by a controller older
than the job key, is carried out as the agent does: on the oldest process of that id, of
whichever job. Such a kill of an id several jobs used on the node lately could end another
job's process: it is counted (`collisions`), which the current controller never causes (0).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import random
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis

from infra import keys as control_keys
from infra import tasks
from infra.node_metrics import NodeUsage
from infra.processes import STAGE_MODULE, cmdline_arg
from infra.queues import node_queue
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import LEASE_FIELD, RELEASED_PREFIX, FenceMemory, check_command
from spark_runtime.generators import generator_replica_id, make_payload_factory
from spark_runtime.jobdef import resolve_topology
from spark_runtime.progress import ProgressRecord
from spark_runtime.spare import REFILL_HOLD_S
from spark_runtime.stage import (
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_STOPPED,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TTL_MS,
    batch_every_s,
    build_parser,
    parse_params,
    wanted_nice,
)
from spark_runtime.topology import OUT_CHANNEL, RESULTS_CHANNEL, stage_spec, with_params

log = logging.getLogger(__name__)

TICK_S = 0.1
NODE_PUBLISH_S = 1.0  # workers.agent.PUBLISH_INTERVAL_S
NODE_HEARTBEAT_TTL_S = 5  # workers.agent.HEARTBEAT_TTL_S
EXIT_POLL_S = 0.1  # workers.agent.EXIT_POLL_S: an exit is reported within this
PIPELINE_CHUNK = 2000
RECENT_S = 60.0  # how long an ended process is remembered for matching kills
FAKE_PID_BASE = 9_000_000  # above any real pid: nothing on this machine answers to these
SIGNAL_CODES = {"SIGKILL": -9, "SIGTERM": -15, "SIGINT": -2}


@dataclass(frozen=True)
class SimTiming:
    """How long the simulated processes take. A cold stage start stands for a new driver, JVM
    and SparkSession (10-15 s on this machine, docs/RESULTS.md); a warm one for a warm spare
    taking the replica over."""

    boot_s: float = 0.3  # the interpreter starts before the first heartbeat
    cold_start_s: float = 8.0
    warm_start_s: float = 1.5
    start_jitter: float = 0.25  # +- this share of the start time
    spare_warmup_s: float = 10.0
    node_cpu: float = 32.0
    node_mem_mb: float = 131072.0
    replica_cpu: float = 0.4
    replica_rss_mb: float = 700.0


@dataclass
class Replica:
    """One simulated stage (or generator) process."""

    pid: int
    job: str
    replica_id: str
    node: str
    stage: str
    role: str
    started_at: float
    up_at: float
    trigger_s: float
    segments: int = 1
    final: bool = False
    cpu_priorities: bool = False
    generator: bool = False
    topology: str = ""
    info: dict = field(default_factory=dict)
    state: str = "booting"  # booting, starting, running, ended
    epoch: int | None = None
    batches: int = 0
    next_hb: float = 0.0
    next_batch: float = 0.0
    fault_after: int | None = None
    payload: object = None  # a generator's payload factory
    seq: int = 0
    successor: bool = False  # an upgrade's new version (--successor)
    # A primary told to hand over (`demote`): becomes a standby right after its next batch and
    # passes the promotion on to this successor ("": none). None: not told.
    demote_to: str | None = None


@dataclass
class Agent:
    """One simulated node agent and its host."""

    name: str
    up: bool = True
    down_until: float | None = None
    next_publish: float = 0.0
    spares: dict[str, dict] = field(default_factory=dict)  # spare id -> entry
    wanted_spares: int = 0
    refill_held: bool = False


@dataclass(frozen=True)
class QueueEvent:
    """A Celery message an agent popped from its queue."""

    at: float
    node: str
    task: str
    job: str  # the job it is about ("" when the message does not say and no process tells)
    stage: str
    replica_id: str
    expired: bool = False
    # The jobs a kill_replica may be about: the one it names; a kill naming no job (an older
    # controller's), every job whose process of that id runs on the node or ended there in the
    # last RECENT_S (a kill of a process that died already is the usual case).
    candidates: tuple[tuple[str, str], ...] = ()
    # When the message landed on the queue (its LPUSH's keyspace event): the controller's act.
    # A node that is down reads its queue only when it is back.
    sent_at: float | None = None
    refused: bool = False  # the fence refused it: not carried out


@dataclass(frozen=True)
class ControlEvent:
    """A command that landed on a replica's control list (time of the keyspace event)."""

    at: float
    job: str
    replica_id: str
    stage: str
    command: dict


@dataclass(frozen=True)
class ExitEvent:
    """An exit an agent reported (`at`: when the sim put it on the agent events stream)."""

    at: float
    node: str
    job: str
    replica_id: str
    stage: str
    returncode: int
    cause: str  # fault, kill_replica, kill_node, stop, fenced, failed


def decode_message(raw) -> tuple[str, list, dict, dict]:
    """(task name, args, kwargs, headers) of a Celery message as the kombu Redis transport
    stores it (protocol 2: a base64 body of [args, kwargs, embed])."""
    message = json.loads(raw)
    body = message["body"]
    if message.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args, kwargs, _embed = json.loads(body)
    headers = message.get("headers") or {}
    return headers.get("task", ""), list(args), dict(kwargs), headers


def expired(headers: dict, now: float) -> bool:
    """Whether the message's `expires` (ISO time) has passed: a Celery worker drops it."""
    raw = headers.get("expires")
    if not raw:
        return False
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        return False
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp() < now


def job_named(task: str, args: list, kwargs: dict) -> str:
    """The job an agent task is about ("" when it names none)."""
    if task == tasks.START_REPLICA.name and len(args) > 3:
        return args[3]
    if task == tasks.START_GENERATOR.name and args:
        return args[0]
    if task == tasks.KILL_REPLICA.name:
        return (args[2] if len(args) > 2 else kwargs.get("job_key")) or ""
    if task == tasks.KILL_NODE.name:
        return (args[0] if args else kwargs.get("job_key")) or ""
    return ""


def command_named(task: str, args: list) -> str:
    """What workers/agent.py calls an agent task in its fence checks and refusals."""
    if task == tasks.START_REPLICA.name and len(args) > 2:
        return f"start {args[2]}"
    if task == tasks.START_GENERATOR.name and args:
        return f"start {generator_replica_id(args[0])}"
    if task == tasks.KILL_REPLICA.name and args:
        return f"kill {args[0]}"
    return task


class CountingPipeline:
    """Collects commands for one pipelined round trip (or several, in chunks)."""

    def __init__(self, client, counter):
        self.client = client
        self.counter = counter
        self.pipe = client.pipeline(transaction=False)
        self.n = 0

    def __getattr__(self, name):
        method = getattr(self.pipe, name)

        def call(*args, **kwargs):
            method(*args, **kwargs)
            self.n += 1
            if self.n >= PIPELINE_CHUNK:
                self.flush()

        return call

    def flush(self) -> list:
        if not self.n:
            return []
        self.counter(self.n)
        out = self.pipe.execute(raise_on_error=False)
        self.n = 0
        return out


class FleetSim:
    """Every node agent and stage replica of a simulated fleet (see the module docstring)."""

    def __init__(
        self,
        redis_url: str,
        nodes: list[str],
        timing: SimTiming | None = None,
        seed: int = 0,
    ):
        self.redis_url = redis_url
        self.timing = timing or SimTiming()
        self.rng = random.Random(seed)
        self.agents = {name: Agent(name) for name in nodes}
        self.lock = threading.RLock()
        self.processes: dict[int, Replica] = {}  # pid -> live process
        self.by_node: dict[str, dict[int, Replica]] = defaultdict(dict)
        self.by_node_id: dict[tuple[str, str], dict[int, Replica]] = defaultdict(dict)
        self.by_job_id: dict[tuple[str, str], dict[int, Replica]] = defaultdict(dict)
        self.spares_taken: list[tuple[str, str]] = []  # (node, spare id) to remove from Redis
        self.pids = itertools.count(FAKE_PID_BASE)
        self.fences: dict[tuple[str, str], int] = {}
        self.pending_exits: list[tuple[float, Replica, int, str]] = []
        self.queue_log: list[QueueEvent] = []
        self.control_log: list[ControlEvent] = []
        self.exit_log: list[ExitEvent] = []
        self.stages_seen: set[tuple[str, str]] = set()  # (job, stage) of every replica started
        self.ended: dict[tuple[str, str], list[tuple[float, str, str]]] = defaultdict(list)
        self.pushed: dict[str, deque] = defaultdict(deque)  # node -> LPUSH times, oldest first
        self.pushed_cv = threading.Condition()  # its own lock: a tick must not delay a push time
        self.collisions: dict[str, int] = defaultdict(int)
        self.counts: dict[str, int] = defaultdict(int)
        self.commands_sent = 0  # Redis commands this simulator sent (its share of the load)
        self._commands_lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.db = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs.get("db", 0)
        self.errors: list[str] = []
        # The fence as the real receivers keep it: one memory per agent (a new one when the
        # agent comes back after its node died) and one per stage process.
        self.agent_fences: dict[str, FenceMemory] = defaultdict(FenceMemory)
        self.stage_fences: dict[int, FenceMemory] = defaultdict(FenceMemory)
        # What the fence let through or not, judged apart from it (`_audit`), and replica ids
        # started while a process of the same job and id ran on another node.
        self.fence_counts: dict[str, int] = defaultdict(int)
        self.stale_examples: list[dict] = []
        self.refusal_examples: list[dict] = []
        self.duplicates: list[dict] = []

    # --- lifecycle ------------------------------------------------------------------------

    def _client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=True)

    def count(self, n: int = 1) -> None:
        with self._commands_lock:
            self.commands_sent += n

    def start(self) -> None:
        for name, target in (
            ("beat", self._beat_loop),
            ("queues", self._queue_loop),
            ("control", self._control_loop),
        ):
            thread = threading.Thread(target=self._guarded(target), name=f"sim-{name}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _guarded(self, loop):
        def run():
            while not self.stopping.is_set():
                try:
                    loop()
                    return
                except redis.RedisError as exc:
                    if self.stopping.is_set():
                        return
                    self.errors.append(f"{loop.__name__}: {exc}")
                    log.warning("fleet sim %s: %s (again in 1 s)", loop.__name__, exc)
                    time.sleep(1.0)

        return run

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(5)

    # --- what the agents carry out -----------------------------------------------------------

    def live_on(self, node: str) -> list[Replica]:
        with self.lock:
            return list(self.by_node[node].values())

    def _find(self, node: str, replica_id: str, job: str | None = None) -> list[Replica]:
        """Live processes of `node` running `replica_id` (of `job` when given), oldest first."""
        found = self.by_node_id.get((node, replica_id), {})
        return sorted((p for p in found.values() if job in (None, p.job)), key=lambda p: p.pid)

    def _add(self, replica: Replica) -> None:
        self.processes[replica.pid] = replica
        self.by_node[replica.node][replica.pid] = replica
        self.by_node_id[(replica.node, replica.replica_id)][replica.pid] = replica
        self.by_job_id[(replica.job, replica.replica_id)][replica.pid] = replica

    def _remove(self, replica: Replica) -> bool:
        if self.processes.pop(replica.pid, None) is None:
            return False
        for index, key in (
            (self.by_node, replica.node),
            (self.by_node_id, (replica.node, replica.replica_id)),
            (self.by_job_id, (replica.job, replica.replica_id)),
        ):
            index[key].pop(replica.pid, None)
            if not index[key]:
                del index[key]
        return True

    def _start(self, node: str, args: list[str], replica_id: str, job: str, warm: bool) -> str:
        """workers.agent.start_replica for a stage of `job`; returns what it did (another job's
        process of the same replica id is another replica)."""
        if (
            cmdline_arg(args, "--job") != job
            or cmdline_arg(args, "--replica-id") != replica_id
            or cmdline_arg(args, "--node") != node
        ):
            self.counts["refused_start"] += 1
            return "refused"
        if self._find(node, replica_id, job):
            self.counts["start_of_running"] += 1
            return "running already"
        parsed, _unknown = build_parser().parse_known_args(args)
        now = time.time()
        agent = self.agents[node]
        took_spare, warm_left = False, 0.0
        if warm:
            idle = sorted(s for s, e in agent.spares.items() if e["state"] == "idle")
            warming = sorted(s for s, e in agent.spares.items() if e["state"] == "starting")
            for spare_id in idle + warming:
                entry = agent.spares.pop(spare_id)
                took_spare = True
                self._spare_taken(node, spare_id)
                if entry["state"] == "starting":
                    warm_left = max(0.0, entry["since"] + self.timing.spare_warmup_s - now)
                else:
                    warm_left = 0.0
                break
        base = self.timing.warm_start_s + warm_left if took_spare else self.timing.cold_start_s
        jitter = 1 + self.rng.uniform(-self.timing.start_jitter, self.timing.start_jitter)
        trigger = parsed.trigger_seconds or 0.5
        topology = parsed.topology
        try:
            spec = with_params(resolve_topology(topology), parse_params(parsed.param))
            operators = [o for o in parsed.operators.split(",") if o]
            stage = stage_spec(spec, parsed.stage, operators, job=parsed.job)
            segments = max(1, len(stage.segments))
            final = bool(set(stage.outputs) & {RESULTS_CHANNEL, OUT_CHANNEL})
        except (KeyError, ValueError):
            segments, final = 1, False
        pid = next(self.pids)
        replica = Replica(
            pid=pid,
            job=job,
            replica_id=replica_id,
            node=node,
            stage=parsed.stage,
            role=parsed.role,
            started_at=now + self.timing.boot_s,
            up_at=now + self.timing.boot_s + base * jitter,
            trigger_s=trigger,
            segments=segments,
            final=final,
            cpu_priorities=parsed.cpu_priorities,
            topology=topology,
            successor=parsed.successor,
        )
        replica.info = {
            "replica": replica_id,
            "stage": parsed.stage,
            "role": parsed.role,
            "pid": pid,
            "node": node,
            "host": f"sim-{node}",
            "state": "starting",
            "epoch": None,
            "started_at": replica.started_at,
            "nice": 0,
        }
        if parsed.seed_from:
            replica.info["seeded_batches"] = 1
        replica.next_hb = replica.started_at
        elsewhere = sorted(p.node for p in self.by_job_id.get((job, replica_id), {}).values())
        if elsewhere:
            # One replica id of one job would run twice: both would write as that replica.
            self.duplicates.append(
                {"at": now, "job": job, "replica_id": replica_id, "nodes": [*elsewhere, node]}
            )
        self._add(replica)
        self.stages_seen.add((replica.job, replica.stage))
        self.counts["started_warm" if took_spare else "started_cold"] += 1
        return "started"

    def _start_generator(self, node: str, job: str, topology: str, rate: float, seed: int) -> None:
        """workers.agent.start_generator: a running one is left alone."""
        replica_id = generator_replica_id(job)
        if self._find(node, replica_id, job):
            return
        if self.by_job_id.get((job, replica_id)):
            self.counts["generator_on_two_nodes"] += 1
        now = time.time()
        pid = next(self.pids)
        try:
            payload = make_payload_factory(topology, random.Random(seed), 1.0)
        except (KeyError, ValueError):
            payload = None
        self._add(Replica(
            pid=pid, job=job, replica_id=replica_id, node=node, stage="", role="",
            started_at=now, up_at=now, trigger_s=1.0, generator=True, topology=topology,
            state="running", payload=payload, next_batch=now + 1.0,
        ))  # fmt: skip
        self.counts["generators_started"] += 1

    def _end(self, replica: Replica, returncode: int, cause: str, report: bool = True) -> None:
        """The process ends; its agent reports the exit within EXIT_POLL_S (not when the whole
        host went down: its agent went with it)."""
        if not self._remove(replica):
            return
        replica.state = "ended"
        self.stage_fences.pop(replica.pid, None)
        now = time.time()
        recent = self.ended[(replica.node, replica.replica_id)]
        recent.append((now, replica.job, replica.stage))
        recent[:] = [e for e in recent if now - e[0] < RECENT_S]
        if report and self.agents[replica.node].up:
            due = time.time() + self.rng.uniform(0, EXIT_POLL_S)
            self.pending_exits.append((due, replica, returncode, cause))

    def _jobs_using(self, node: str, replica_id: str, now: float) -> set[str]:
        """Jobs whose process of `replica_id` runs on `node` or ended there within RECENT_S."""
        jobs = {p.job for p in self._find(node, replica_id)}
        ended = self.ended.get((node, replica_id), [])
        return jobs | {j for at, j, _ in ended if now - at < RECENT_S}

    def _kill(
        self, node: str, replica_id: str, signal_name: str, now: float, job: str | None
    ) -> bool:
        """workers.agent.kill_replica: the process of replica `replica_id` of `job` on `node`.

        A kill naming no job (`job` None: an older controller's message) takes the oldest
        process of that id, of whichever job, as the agent's fallback does; when several jobs
        used that id on the node lately it may be another job's, and is counted a collision."""
        if job is None:
            self.counts["kill_without_job"] += 1
            if len(self._jobs_using(node, replica_id, now)) > 1:
                self.collisions["kill_replica"] += 1
        found = self._find(node, replica_id, job)
        if not found:
            return False
        self._end(found[0], SIGNAL_CODES.get(signal_name, -9), "kill_replica")
        return True

    def _kill_node_stages(self, node: str, job: str | None) -> None:
        """workers.agent.kill_node: every stage process of the node (not the generators)."""
        for replica in self.live_on(node):
            if not replica.generator and job in (None, replica.job):
                self._end(replica, -9, "kill_node")

    def handle_message(
        self, node: str, raw, popped_at: float, sent_at: float | None = None, client=None
    ) -> None:
        """One Celery message popped from `node`'s queue (`sent_at`: when it landed there).
        A controller's command (one carrying its lease token) is judged by the agent's fence
        first, as workers/agent.py does (`client`: a Redis connection decoding responses, for
        the lease read); a refused one is not carried out."""
        task, args, kwargs, headers = decode_message(raw)
        late = expired(headers, popped_at)
        token = kwargs.get(LEASE_FIELD)
        about = job_named(task, args, kwargs)
        what = command_named(task, args)
        refused = False
        if token is not None and not late and about:
            # A worker drops an expired message before its task runs: no fence check then.
            verdict = check_command(
                client, self.agent_fences[node], about, token, f"agent {node}", what
            )
            self.count()
            refused = not verdict.accepted
            if refused:
                self._refused(about, what, token, verdict.reason, f"agent {node}")
        carry_out = not late and not refused
        job = stage = replica_id = ""
        candidates: set[tuple[str, str]] = set()
        with self.lock:
            if task == tasks.START_REPLICA.name:
                module, stage_args, replica_id, job = args[:4]
                stage = cmdline_arg(stage_args, "--stage") or ""
                if carry_out and module == STAGE_MODULE:
                    self._start(node, stage_args, replica_id, job, kwargs.get("warm", False))
                elif carry_out:
                    self.counts["refused_start"] += 1
            elif task == tasks.START_GENERATOR.name:
                job = args[0]
                replica_id = generator_replica_id(job)
                if carry_out:
                    rate = args[2] if len(args) > 2 else 1.0
                    seed = args[3] if len(args) > 3 else 0
                    self._start_generator(node, job, args[1], rate, seed)
            elif task == tasks.KILL_REPLICA.name:
                replica_id = args[0]
                signal_name = args[1] if len(args) > 1 else kwargs.get("signal_name", "SIGKILL")
                named = (args[2] if len(args) > 2 else kwargs.get("job_key")) or None
                found = self._find(node, replica_id, named)
                if found:
                    job, stage = found[0].job, found[0].stage
                candidates = {(p.job, p.stage) for p in found}
                candidates |= {
                    (j, st)
                    for at, j, st in self.ended.get((node, replica_id), [])
                    if popped_at - at < RECENT_S and named in (None, j)
                }
                if named is not None:
                    job = named
                    candidates = candidates or {(named, "")}
                if carry_out:
                    self._kill(node, replica_id, signal_name, popped_at, named)
            elif task == tasks.KILL_NODE.name:
                job = (args[0] if args else kwargs.get("job_key")) or ""
                if carry_out:
                    self._kill_node_stages(node, job or None)
            else:
                self.counts[f"unhandled {task}"] += 1
            if late:
                self.counts["expired_messages"] += 1
            self.queue_log.append(
                QueueEvent(popped_at, node, task, job, stage, replica_id, late,
                           tuple(sorted(candidates)), sent_at, refused)
            )  # fmt: skip
        if token is not None and carry_out and about:
            self._audit(client, about, token, what, f"agent {node}")

    def _refused(self, job: str, command: str, token: str, reason: str, receiver: str) -> None:
        with self.lock:
            self.fence_counts["refused"] += 1
            if len(self.refusal_examples) < 5:
                self.refusal_examples.append(
                    {"at": time.time(), "job": job, "command": command, "token": token,
                     "receiver": receiver, "reason": reason}
                )  # fmt: skip

    def _audit(self, client, job: str, token: str, command: str, receiver: str) -> None:
        """Judge a controller's command carried out just now, apart from the fence: it is stale
        when the job's lease, read now, holds neither its token nor the token released (its
        sender no longer held the job)."""
        lease = client.get(data_keys.controller_lease(job))
        self.count()
        with self.lock:
            self.fence_counts["carried_out"] += 1
            if lease in (token, RELEASED_PREFIX + token):
                return
            self.fence_counts["stale_executed"] += 1
            if len(self.stale_examples) < 5:
                self.stale_examples.append(
                    {"at": time.time(), "job": job, "command": command, "token": token,
                     "lease": lease, "receiver": receiver}
                )  # fmt: skip

    def _queue_loop(self) -> None:
        client = redis.Redis.from_url(self.redis_url)
        fence_client = self._client()
        while not self.stopping.is_set():
            with self.lock:
                queues = {node_queue(a.name): a.name for a in self.agents.values() if a.up}
            if not queues:
                time.sleep(0.2)
                continue
            popped = client.brpop(list(queues), timeout=0.5)
            self.count()
            if popped is None:
                continue
            queue, raw = popped
            now = time.time()
            node = queues[queue.decode()]
            self.handle_message(node, raw, now, self._push_time(node), fence_client)

    def _push_time(self, node: str) -> float | None:
        """When the message just popped from `node`'s queue was pushed: the oldest push heard
        and not yet paired (BRPOP takes the oldest message; its keyspace event may still be on
        its way to the control thread)."""
        with self.pushed_cv:
            self.pushed_cv.wait_for(lambda: self.pushed[node], timeout=0.2)
            if not self.pushed[node]:
                self.counts["pops_without_push_event"] += 1
                return None
            return self.pushed[node].popleft()

    # --- what the stages obey ------------------------------------------------------------------

    def _control_loop(self) -> None:
        client = self._client()
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        prefix = f"__keyspace@{self.db}__:"
        pubsub.psubscribe(
            prefix + data_keys.make_key("*", "control", "*"), prefix + node_queue("*")
        )
        queue_prefix = node_queue("x")[:-1]
        next_sweep = time.time() + 5.0
        while not self.stopping.is_set():
            message = pubsub.get_message(timeout=0.5)
            now = time.time()
            if message is not None and message.get("data") in ("rpush", "lpush"):
                key = message["channel"][len(prefix) :]
                if key.startswith(queue_prefix):
                    with self.pushed_cv:
                        self.pushed[key[len(queue_prefix) :]].append(now)
                        self.pushed_cv.notify_all()
                else:
                    self._obey(client, key, now)
            if now >= next_sweep:
                # A command that landed while its replica was still starting waits in its list,
                # as for a real stage (it blocks on its list only once its queries run).
                next_sweep = now + 5.0
                with self.lock:
                    running = [
                        data_keys.control(p.job, p.replica_id)
                        for p in self.processes.values()
                        if p.state == "running" and not p.generator
                    ]
                pipe = client.pipeline(transaction=False)
                for key in running:
                    pipe.llen(key)
                self.count(len(running))
                for key, length in zip(running, pipe.execute(), strict=True):
                    if length:
                        self._obey(client, key, now)
        pubsub.close()

    def _replica_of_key(self, key: str) -> Replica | None:
        # backstop:{job}:control:{replica}
        parts = key.split(":")
        if len(parts) < 4 or parts[-2] != "control":
            return None
        job, replica_id = ":".join(parts[1:-2]), parts[-1]
        with self.lock:
            live = sorted(self.by_job_id.get((job, replica_id), {}).values(), key=lambda p: p.pid)
        return live[0] if live and not live[0].generator else None

    def _obey(self, client, key: str, at: float) -> None:
        replica = self._replica_of_key(key)
        if replica is None or replica.state != "running":
            return
        while True:
            raw = client.lpop(key)
            self.count()
            if raw is None:
                return
            try:
                command = json.loads(raw)
            except ValueError:
                continue
            token = command.get(LEASE_FIELD) if isinstance(command, dict) else None
            receiver = f"stage {replica.replica_id}"  # as spark_runtime/stage.py says it
            what = str(command.get("cmd")) if isinstance(command, dict) else "?"
            if token is not None:
                # spark_runtime/stage.py: a controller's command is judged by the fence first.
                verdict = check_command(
                    client, self.stage_fences[replica.pid], replica.job, token, receiver, what
                )
                self.count()
                if not verdict.accepted:
                    self._refused(replica.job, what, token, verdict.reason, receiver)
                    continue
            with self.lock:
                self.control_log.append(
                    ControlEvent(at, replica.job, replica.replica_id, replica.stage, command)
                )
            ended = self._command(client, replica, command)
            if token is not None:
                self._audit(client, replica.job, token, what, receiver)
            if ended:
                return

    def _command(self, client, replica: Replica, command: dict) -> bool:
        """spark_runtime.stage.handle_command; True when the process ends."""
        cmd = command.get("cmd")
        with self.lock:
            if replica.state != "running":
                return True
            if cmd == "stop":
                replica.info["state"] = "stopped"
                self._publish_now(client, replica, delete_heartbeat=True)
                self._end(replica, EXIT_STOPPED, "stop")
                return True
            if cmd == "promote":
                if replica.role == "primary":
                    return False
                epoch = int(client.incr(data_keys.fence(replica.job, replica.stage)))
                self.count()
                key = (replica.job, replica.stage)
                self.fences[key] = max(self.fences.get(key, 0), epoch)
                replica.role = "primary"
                replica.epoch = epoch
                replica.info.update(
                    role="primary", state="running", epoch=epoch, promoted_at=time.time()
                )
                replica.info["batch_every_s"] = None
                self._renice(replica)
                self._publish_now(client, replica)
                self.counts["promotions"] += 1
                return False
            if cmd == "demote":
                # Carried out right after its next batch (`_batch`).
                if replica.role == "primary":
                    replica.demote_to = command.get("successor") or ""
                return False
            if cmd == "trigger":
                replica.trigger_s = float(command.get("seconds", replica.trigger_s))
                replica.info["trigger_seconds"] = replica.trigger_s
            elif cmd == "checkpoint_interval":
                replica.info.update(
                    checkpoint_interval_s=float(command.get("seconds", 0)),
                    interval_since=time.time(),
                    confs=command.get("confs") or {},
                )
            elif cmd == "fault" and command.get("kind") == "operator_exception":
                replica.fault_after = int(command.get("after_batches", 1))
            self._publish_now(client, replica)
        return False

    def _renice(self, replica: Replica) -> None:
        nice = wanted_nice(
            replica.cpu_priorities, replica.role, "running", replica.batches > 0, replica.successor
        )
        replica.info["nice"] = nice
        replica.info["batch_every_s"] = batch_every_s(nice)

    def _publish_now(self, client, replica: Replica, delete_heartbeat: bool = False) -> None:
        pipe = client.pipeline(transaction=False)
        self._beat(pipe, replica, time.time())
        if delete_heartbeat:
            pipe.delete(data_keys.heartbeat(replica.job, replica.replica_id))
            pipe.delete(data_keys.batch_pace(replica.job, replica.replica_id))
        self.count(len(pipe.command_stack))
        pipe.execute()

    # --- what is written every tick -------------------------------------------------------------

    def _beat(self, pipe, replica: Replica, now: float) -> None:
        """ReplicaState.publish: the replicas-hash entry, the heartbeat, the batch pace."""
        replica.info["updated"] = now
        payload = json.dumps(replica.info)
        pipe.hset(data_keys.replicas(replica.job), replica.replica_id, payload)
        pipe.set(data_keys.heartbeat(replica.job, replica.replica_id), payload, px=HEARTBEAT_TTL_MS)
        pace = data_keys.batch_pace(replica.job, replica.replica_id)
        if replica.info.get("batch_every_s") is not None:
            pipe.set(pace, replica.info["batch_every_s"], px=HEARTBEAT_TTL_MS)
        else:
            pipe.delete(pace)

    def _progress(self, pipe, replica: Replica, now: float) -> None:
        primary = replica.role == "primary"
        rows = max(1, int(25 * replica.trigger_s))
        for segment in range(replica.segments):
            final = replica.final and segment == replica.segments - 1
            written = rows if primary and final else 0
            record = ProgressRecord(
                replica=replica.replica_id,
                stage=replica.stage,
                role=replica.role,
                node=replica.node,
                query=f"{replica.job}.{replica.stage}.{replica.role}.{segment}",
                segment=str(segment),
                batch=replica.batches // replica.segments,
                at=now,
                input_rows=rows,
                input_rate=rows / replica.trigger_s,
                processed_rate=rows / 0.12,
                batch_ms=120.0,
                state_rows=200,
                state_memory_bytes=400_000,
                rows_out=rows,
                written=written,
                final=final,
                buffered=0 if primary else rows,
                latency_p50=0.6 if written else None,
                latency_p90=0.8 if written else None,
                latency_p99=1.0 if written else None,
            )
            pipe.xadd(
                data_keys.progress(replica.job),
                record.to_fields(),
                maxlen=data_keys.PROGRESS_MAXLEN,
                approximate=True,
            )

    def _up(self, replicas: list[Replica], client) -> None:
        """Replicas whose start is over: a primary takes a new fencing epoch (FencedWriter
        .acquire), every one reports `running`."""
        primaries = [r for r in replicas if r.role == "primary"]
        epochs = []
        if primaries:
            pipe = client.pipeline(transaction=False)
            for replica in primaries:
                pipe.incr(data_keys.fence(replica.job, replica.stage))
            self.count(len(primaries))
            epochs = pipe.execute()
        by_pid = {r.pid: int(e) for r, e in zip(primaries, epochs, strict=True)}
        with self.lock:
            for replica in replicas:
                if replica.pid not in self.processes:
                    continue
                epoch = by_pid.get(replica.pid, 0)
                if replica.role == "primary":
                    key = (replica.job, replica.stage)
                    self.fences[key] = max(self.fences.get(key, 0), epoch)
                replica.epoch = epoch
                replica.state = "running"
                replica.info.update(
                    state="running",
                    epoch=epoch,
                    checkpoint=f"var/checkpoints/{replica.job}/{replica.stage}/{replica.replica_id}",
                    spark_app=f"sim-{replica.job}-{replica.replica_id}",
                )
                replica.next_batch = time.time() + replica.trigger_s
                replica.next_hb = 0.0  # publish now
        # Commands sent while it started wait in its list: read them now.
        for replica in replicas:
            if replica.pid in self.processes:
                self._obey(client, data_keys.control(replica.job, replica.replica_id), time.time())

    def _beat_loop(self) -> None:
        client = self._client()
        while not self.stopping.wait(TICK_S):
            self._tick(client, time.time())

    def _tick(self, client, now: float) -> None:
        with self.lock:
            coming_up = [
                p for p in self.processes.values() if p.state == "starting" and now >= p.up_at
            ]
        if coming_up:
            self._up(coming_up, client)
        pipe = CountingPipeline(client, self.count)
        exits: list[tuple[Replica, int, str]] = []
        with self.lock:
            self._wake_nodes(now)
            for replica in list(self.processes.values()):
                if replica.generator:
                    if now >= replica.next_batch:
                        replica.next_batch = now + 1.0
                        self._generate(pipe, replica, now)
                    continue
                if replica.state == "booting" and now >= replica.started_at:
                    replica.state = "starting"
                due_batch = replica.state == "running" and now >= replica.next_batch
                if due_batch and self._batch(pipe, replica, now):
                    continue
                if replica.state in ("starting", "running") and now >= replica.next_hb:
                    replica.next_hb = now + HEARTBEAT_INTERVAL
                    self._beat(pipe, replica, now)
            for agent in self.agents.values():
                if agent.up and now >= agent.next_publish:
                    agent.next_publish = now + NODE_PUBLISH_S
                    self._publish_node(pipe, agent, now)
            for node, spare_id in self.spares_taken:
                pipe.hdel(data_keys.spares(node), spare_id)
            if self.spares_taken:
                pipe.set(data_keys.spare_refill_hold(), "1", ex=REFILL_HOLD_S)
            self.spares_taken = []
            due = [e for e in self.pending_exits if e[0] <= now]
            self.pending_exits = [e for e in self.pending_exits if e[0] > now]
            for _, replica, code, cause in due:
                if self.agents[replica.node].up:
                    exits.append((replica, code, cause))
        pipe.flush()
        if exits:
            pipe = client.pipeline(transaction=False)
            for replica, code, _ in exits:
                pipe.xadd(
                    control_keys.agent_events(),
                    {
                        "kind": control_keys.EVENT_EXIT,
                        "node": replica.node,
                        "job": replica.job,
                        "replica_id": replica.replica_id,
                        "returncode": str(code),
                        "log_tail": f"(simulated) {replica.replica_id} of {replica.job} ended",
                        "at": str(time.time()),
                        "since": str(replica.started_at - self.timing.boot_s),
                    },
                    maxlen=control_keys.AGENT_EVENTS_MAXLEN,
                    approximate=True,
                )
            self.count(len(exits))
            reported_at = time.time()
            pipe.execute()
            with self.lock:
                for replica, code, cause in exits:
                    self.exit_log.append(
                        ExitEvent(reported_at, replica.node, replica.job, replica.replica_id,
                                  replica.stage, code, cause)
                    )  # fmt: skip
        # Spare targets and the refill hold, for the next round of node publishing.
        if int(now) != int(now - TICK_S):
            self._read_spare_targets(client)

    def _batch(self, pipe, replica: Replica, now: float) -> bool:
        """One micro-batch of a running replica; True when it ended the process."""
        pace = replica.info.get("batch_every_s")
        replica.next_batch = now + (pace or replica.trigger_s)
        if replica.role == "primary":
            current = self.fences.get((replica.job, replica.stage), 0)
            if replica.epoch is not None and current > replica.epoch:
                replica.info.update(state="fenced", error="FencedError: FENCED stage epoch moved")
                self._beat(pipe, replica, now)
                pipe.delete(data_keys.heartbeat(replica.job, replica.replica_id))
                self._end(replica, EXIT_FENCED, "fenced")
                return True
        if replica.fault_after is not None:
            replica.fault_after -= 1
            if replica.fault_after <= 0:
                error = "InjectedFault: injected operator exception"
                replica.info.update(state="failed", error=error)
                self._beat(pipe, replica, now)
                pipe.delete(data_keys.heartbeat(replica.job, replica.replica_id))
                self._end(replica, EXIT_FAILED, "failed")
                return True
        first = replica.batches == 0
        replica.batches += replica.segments
        replica.info["batches"] = replica.batches
        if first:
            self._renice(replica)
            if replica.role != "primary":
                replica.info["lag_s"] = 0.0
        self._progress(pipe, replica, now)
        if replica.demote_to is not None:
            self._demoted(pipe, replica, now)
        return False

    def _demoted(self, pipe, replica: Replica, now: float) -> None:
        """spark_runtime.stage's `demote`, once the batch is written: a standby from now on,
        at full pace, passing the promotion on to its successor at once (no lease token: the
        stage's own command, not a controller's)."""
        successor, replica.demote_to = replica.demote_to, None
        replica.role = "standby"
        replica.info.update(
            role="standby", state="running", demoted_at=now, batch_every_s=None, lag_s=0.0
        )
        self._beat(pipe, replica, now)
        if successor:
            promote = json.dumps({"cmd": "promote", "from": replica.replica_id})
            pipe.rpush(data_keys.control(replica.job, successor), promote)
        self.counts["demotions"] += 1

    def _generate(self, pipe, replica: Replica, now: float) -> None:
        """A trickle of the job's input (one entry a second): the input stream exists and grows,
        as the controller's recovery measurement expects; the stages' load is simulated."""
        replica.seq += 1
        fields = {"id": f"{replica.job}-{replica.seq}", "ts": str(int(now * 1000))}
        if replica.payload is not None:
            with contextlib.suppress(TypeError, AttributeError):
                fields.update({k: str(v) for k, v in replica.payload(int(now * 1000)).items()})
        pipe.xadd(data_keys.input_stream(replica.job), fields, maxlen=1000, approximate=True)

    def _publish_node(self, pipe, agent: Agent, now: float) -> None:
        """workers.agent.publish_forever: heartbeat, usage sample, replica activity, spares."""
        live = list(self.by_node[agent.name].values())
        stages = [p for p in live if p.state in ("starting", "running")]
        self._reconcile_spares(pipe, agent, now)
        idle = sum(1 for e in agent.spares.values() if e["state"] == "idle")
        cpu_total, mem_total = self.timing.node_cpu, self.timing.node_mem_mb
        cpu_used = min(cpu_total, 0.3 + self.timing.replica_cpu * len(stages))
        processes = len(live) + len(agent.spares)
        mem_used = min(mem_total, 2048 + self.timing.replica_rss_mb * processes)
        usage = NodeUsage(
            cpu_total=cpu_total, cpu_used=round(cpu_used, 3), mem_total=mem_total,
            mem_used=round(mem_used, 1), disk_throughput=5.0, disk_max_throughput=200.0,
            bw_used=10.0, bw_total=1000.0, at=now, processes=len(live),
        ).to_dict()  # fmt: skip
        payload = json.dumps({**usage, "spares": idle})
        pipe.set(control_keys.node_heartbeat(agent.name), payload, ex=NODE_HEARTBEAT_TTL_S)
        pipe.xadd(
            control_keys.node_metrics(agent.name),
            {"sample": payload},
            maxlen=control_keys.NODE_METRICS_MAXLEN,
            approximate=True,
        )
        by_job: dict[str, dict[str, str]] = {}
        for replica in live:
            share = self.timing.replica_cpu if replica.state == "running" else 0.9
            entry = {
                "cpu": share, "cpu_avg": share, "rss_mb": self.timing.replica_rss_mb,
                "busy": True, "at": now,
            }  # fmt: skip
            by_job.setdefault(replica.job, {})[replica.replica_id] = json.dumps(entry)
        for job, entries in by_job.items():
            pipe.hset(control_keys.replica_activity(job), mapping=entries)
            pipe.expire(control_keys.replica_activity(job), control_keys.ACTIVITY_TTL_S)

    def _read_spare_targets(self, client) -> None:
        with self.lock:
            names = [a.name for a in self.agents.values() if a.up]
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.get(data_keys.spares_wanted(name))
        pipe.exists(data_keys.spare_refill_hold())
        self.count(len(names) + 1)
        *wanted, held = pipe.execute()
        with self.lock:
            for name, value in zip(names, wanted, strict=True):
                self.agents[name].wanted_spares = int(value or 0)
                self.agents[name].refill_held = bool(held)

    def _reconcile_spares(self, pipe, agent: Agent, now: float) -> None:
        """workers.agent.reconcile_spares: one spare more or fewer per round; a spare warms up
        in spare_warmup_s."""
        for spare_id, entry in agent.spares.items():
            if entry["state"] == "starting" and now - entry["since"] >= self.timing.spare_warmup_s:
                entry["state"] = "idle"
                pipe.hset(data_keys.spares(agent.name), spare_id, json.dumps(entry))
        if len(agent.spares) < agent.wanted_spares and not agent.refill_held:
            warming = any(e["state"] == "starting" for e in agent.spares.values())
            if not warming:
                spare_id = f"spare-{agent.name}-{int(now * 1000)}"
                entry = {"pid": next(self.pids), "state": "starting", "since": now}
                agent.spares[spare_id] = entry
                pipe.hset(data_keys.spares(agent.name), spare_id, json.dumps(entry))
        elif len(agent.spares) > agent.wanted_spares:
            extra = sorted(agent.spares)[-1]
            del agent.spares[extra]
            pipe.hdel(data_keys.spares(agent.name), extra)

    def _spare_taken(self, node: str, spare_id: str) -> None:
        """workers.agent.hand_to_spare: the spare's entry goes and refills are held (written
        with the next tick)."""
        self.spares_taken.append((node, spare_id))

    # --- faults the schedule injects ----------------------------------------------------------

    def running_replicas(self) -> list[Replica]:
        """Live stage replicas that have run at least one batch (candidates for a kill)."""
        with self.lock:
            return [
                p
                for p in self.processes.values()
                if not p.generator and p.state == "running" and p.batches > 0
            ]

    def kill_process(self, pid: int) -> Replica | None:
        """A stage process dies (SIGKILL, out of the blue); its agent reports the exit."""
        with self.lock:
            replica = self.processes.get(pid)
            if replica is None or not self.agents[replica.node].up:
                return None
            self._end(replica, -9, "fault")
            return replica

    def kill_node(self, node: str, down_s: float) -> list[Replica]:
        """The host goes down: every process on it dies with its agent (no exit is reported),
        its heartbeats stop and its queue is not read, for `down_s`; then the agent comes back
        with nothing running."""
        with self.lock:
            agent = self.agents[node]
            victims = list(self.by_node[node].values())
            for replica in victims:
                self._end(replica, -9, "node", report=False)
            self.pending_exits = [e for e in self.pending_exits if e[1].node != node]
            agent.up = False
            agent.down_until = time.time() + down_s
            agent.spares.clear()
            # Its agent died with it: the one that comes back remembers nothing.
            self.agent_fences.pop(node, None)
        client = self._client()
        client.delete(data_keys.spares(node))
        self.count()
        return victims

    def _wake_nodes(self, now: float) -> None:
        for agent in self.agents.values():
            if not agent.up and agent.down_until is not None and now >= agent.down_until:
                agent.up, agent.down_until, agent.next_publish = True, None, 0.0

    # --- for the measurement ---------------------------------------------------------------------

    def processes_of(self, job: str) -> list[Replica]:
        """The live processes (stages and generator) of `job`."""
        with self.lock:
            return [p for p in self.processes.values() if p.job == job]

    def fence_figures(self) -> dict:
        """What the fence did and what got through it (`_audit`), and replica ids started
        twice."""
        with self.lock:
            return {
                "stale_commands_executed": self.fence_counts["stale_executed"],
                "stale_commands_refused": self.fence_counts["refused"],
                "duplicate_replica_starts": len(self.duplicates),
                "fenced_commands_carried_out": self.fence_counts["carried_out"],
                "stale_examples": list(self.stale_examples),
                "refusal_examples": list(self.refusal_examples),
                "duplicate_examples": self.duplicates[:5],
            }

    def snapshot(self) -> dict:
        with self.lock:
            return {
                "processes": sum(1 for p in self.processes.values() if not p.generator),
                "running": sum(
                    1 for p in self.processes.values() if not p.generator and p.state == "running"
                ),
                "generators": sum(1 for p in self.processes.values() if p.generator),
                "nodes_up": sum(1 for a in self.agents.values() if a.up),
            }
