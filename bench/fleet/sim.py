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
  (infra.node_metrics.NodeUsage, workers.node.loops.publish_forever), the replicas' activity, the
  warm spares the controller asks for, a trickle of input per generator, and the agents' exit
  events (workers.node.children._publish_exit, within EXIT_POLL_S of the exit).

A controller's command carries its lease token (spark_runtime.command_fence): each simulated
agent and each simulated stage judges it with `carrying_out`, the function the real ones call,
with a FenceMemory of its own, and refuses (does not carry out) what the fence refuses; the
job's lease stays put while an accepted command is carried out and audited. Apart from the
fence, every controller's command carried out is audited against the job's lease read right
after (`_audit`: stale when the lease holds neither its token nor the token released, or another
controller took the job since), and a start of a replica id of a job while that replica runs on
another node is a duplicate.

What a replica reports follows its simulated life: `starting` when its process boots, `running`
with its epoch once its (cold or warm) start is over, one batch per trigger after that. A primary
that finds its stage's fencing epoch moved on exits with code 3 at its next batch.

Which process a message names: replica ids (`{stage}-{n}`: every restart-all job's one replica
is `job-1`) repeat across jobs, so the agent knows a replica by its job and its id
(workers.node.children.find_replica_process, running_replica), as the simulated one does: a
start names its job and is taken for done only when that job's replica runs; a kill names its job
(`job_key`) and ends only that job's process. A kill naming no job, queued by a controller older
than the job key, is carried out as the agent does: on the oldest process of that id, of
whichever job. Such a kill of an id several jobs used on the node lately could end another
job's process: it is counted (`collisions`), which the current controller never causes (0).
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections import defaultdict, deque

import redis

from bench.fleet.sim_agents import AgentSide
from bench.fleet.sim_model import (
    EXIT_POLL_S,
    FAKE_PID_BASE,
    NODE_PUBLISH_S,
    RECENT_S,
    TICK_S,
    Agent,
    ControlEvent,
    CountingPipeline,
    ExitEvent,
    QueueEvent,
    Replica,
    SimTiming,
)
from bench.fleet.sim_stages import StageSide
from infra import keys as control_keys
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import RELEASED_PREFIX, FenceMemory, tenure_of
from spark_runtime.spare import REFILL_HOLD_S
from spark_runtime.stage import (
    HEARTBEAT_INTERVAL,
)

log = logging.getLogger(__name__)


class FleetSim(AgentSide, StageSide):
    """Every node agent and stage replica of a simulated fleet (see the module docstring): the
    process table both sides share, the threads, the fence audit and the figures."""

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
        when the job's lease, read now, holds neither its token nor the token released, unless
        it merely ran out with nobody taking the job since (the tenure counter still at the
        command's tenure): then no other controller can have acted on the job."""
        lease, tenure = client.mget(
            data_keys.controller_lease(job), data_keys.controller_tenure(job)
        )
        self.count()
        with self.lock:
            self.fence_counts["carried_out"] += 1
            if lease in (token, RELEASED_PREFIX + token):
                return
            if lease is None and int(tenure or 0) == tenure_of(token):
                return
            self.fence_counts["stale_executed"] += 1
            if len(self.stale_examples) < 5:
                self.stale_examples.append(
                    {"at": time.time(), "job": job, "command": command, "token": token,
                     "lease": lease, "tenure": tenure, "receiver": receiver}
                )  # fmt: skip

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

    def running_replicas(self) -> list[Replica]:
        """Live stage replicas that have run at least one batch (candidates for a kill)."""
        with self.lock:
            return [
                p
                for p in self.processes.values()
                if not p.generator and p.state == "running" and p.batches > 0
            ]

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
