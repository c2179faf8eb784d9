"""The simulated fleet's vocabulary (bench/fleet/sim.py says what the simulator does): its
timings, its processes and agents, the events it logs, and how it reads a Celery message."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from infra import tasks
from spark_runtime.generators import generator_replica_id

TICK_S = 0.1
NODE_PUBLISH_S = 1.0  # workers.node.loops.PUBLISH_INTERVAL_S
NODE_HEARTBEAT_TTL_S = 5  # workers.node.loops.HEARTBEAT_TTL_S
EXIT_POLL_S = 0.1  # workers.node.loops.EXIT_POLL_S: an exit is reported within this
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
