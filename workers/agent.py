"""Node agent: a Celery worker consuming `node.<name>` that starts, stops, kills, pauses and
stresses the stage processes of its node, and publishes the node's heartbeat and metrics.

Run one per node with `BACKSTOP_NODE=<name>` and `--pool solo`: the solo pool runs tasks in the
worker's main process, so the Popen handles of the stage processes live next to the monitor
thread that reaps them and reports their exits.

This module holds the agent's Celery tasks (each checks its message, checks a controller's
command against the job's lease through `fenced`, and calls the work) and the worker's signal
hooks; the work is in workers/node/ (children, spares, replicas, faults, loops).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from celery import shared_task
from celery.signals import worker_ready, worker_shutting_down
from django.conf import settings

from console.policy.fault_params import KILL_EXECUTOR, KILL_WORKER
from console.redis import redis_client
from infra import tasks
from infra.processes import cmdline_arg
from spark_runtime.command_fence import FenceMemory, carrying_out
from spark_runtime.env import env
from spark_runtime.generators import generator_replica_id
from workers.node import children, faults, loops, replicas
from workers.node.identity import this_node

log = logging.getLogger(__name__)

# The newest lease tenure this agent saw per job: a controller's command of an older one is
# refused (spark_runtime.command_fence).
_fence = FenceMemory()


@contextmanager
def fenced(job_key: str, lease: str | None, command: str) -> Iterator[bool]:
    """Whether to carry out a controller's `command` for `job_key` sent under `lease`: only
    while the job's lease still holds it, and the lease stays put while the body carries it out
    (spark_runtime.command_fence.carrying_out); a refusal is logged and put on the
    refused-commands stream."""
    if lease is None:
        yield True
        return
    with (
        redis_client() as client,
        carrying_out(client, _fence, job_key, lease, f"agent {this_node()}", command) as verdict,
    ):
        yield verdict.accepted


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
    allowed = children.ALLOWED_ENTRY_POINTS
    if module not in allowed or allowed[module] not in (None, args[0]):
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
    with fenced(job_key, lease, f"start {replica_id}") as accepted:
        return replicas.start(module, args, replica_id, job_key, warm) if accepted else 0


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
        return children.kill(replica_id, signal_name, None)
    with fenced(job_key, lease, f"kill {replica_id}") as accepted:
        return children.kill(replica_id, signal_name, job_key) if accepted else False


@shared_task(**tasks.KILL_NODE.options())
def kill_node(job_key: str | None = None) -> list[int]:
    """SIGKILL every stage process of this node (of one job, when given); return their pids."""
    return faults.kill_node(job_key)


@shared_task(**tasks.KILL_SPARK_PROCESS.options())
def kill_spark_process(
    app_id: str, fault_kind: str, fault_id: int | None = None, job_key: str | None = None
) -> list[int]:
    """For fault `kill-executor`: SIGKILL the first executor of Spark application `app_id` on
    this host; for `kill-worker`: the Spark worker that runs it, with every executor it
    launched. Returns the pids killed; once per fault (workers.node.faults.kill_spark_process).
    """
    if fault_kind not in (KILL_EXECUTOR, KILL_WORKER):
        raise ValueError(f"fault_kind: {KILL_EXECUTOR} or {KILL_WORKER}, got {fault_kind!r:.40}")
    return faults.kill_spark_process(app_id, fault_kind, fault_id, job_key)


@shared_task(**tasks.PAUSE_NODE.options())
def pause_node(
    duration_s: float, job_key: str | None = None, fault_id: int | None = None
) -> list[int]:
    """SIGSTOP this node's stage processes for `duration_s` seconds (a hang or partition);
    return their process groups. Params over this node's limits are refused
    (workers.node.faults.FaultRefusedByAgent)."""
    return faults.pause_node(duration_s, job_key, fault_id)


@shared_task(**tasks.STRESS_NODE.options())
def stress_node(
    duration_s: float, workers: int = 1, fault_id: int | None = None, job_key: str | None = None
) -> list[int]:
    """Start `workers` CPU hogs tagged with this node for `duration_s` seconds; return their
    pids. More hogs than the node's cores, or a duration over the maximum, are refused."""
    return faults.stress_node(duration_s, workers, fault_id, job_key)


@worker_ready.connect
def start_agent_loop(sender=None, **kwargs) -> None:
    """Begin publishing when this worker is a node agent (BACKSTOP_NODE set)."""
    node = env("BACKSTOP_NODE", None)
    if node:
        loops.start(node)


@worker_shutting_down.connect
def stop_agent_loop(**kwargs) -> None:
    """Stop the agent's loops when the worker shuts down."""
    loops.stop()
