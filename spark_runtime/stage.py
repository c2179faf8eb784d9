"""The stage process: one replica (primary or hot standby) of one stage of a job.

    python -m spark_runtime.stage --job ID --topology NAME --stage NAME --operators OP,OP \
        --role primary|standby --replica-id ID --node NODE [--redis-url URL] \
        [--checkpoint-dir DIR] [--seed-from DIR] [--cpu-priorities] [--recovery-first] \
        [--successor] \
        [--trigger-seconds S] [--checkpoint-interval S --spark-conf KEY=VALUE ...] \
        [--light-input-wait-s S] [--param OP.KEY=VALUE ...]

A standby started with `--seed-from` (its primary's checkpoint) begins from a copy of the
primary's latest committed batch instead of replaying the input from the beginning. With
`--cpu-priorities` a primary runs above the normal CPU priority (where the process may raise
it) and a caught-up standby below it (spark_runtime/strategies.py has the levels); with
`--recovery-first` a primary restored from its checkpoint or promoted runs above every job's
steady work for a while (the strategy decides each apart: local-restart has only the latter).
`--light-input-wait-s` lets its Redis sources hold light input up to that long before a batch
reads it (spark_runtime/redis_source.py, RedisStreamReader.hold_light_input): a replica with
little input pays a micro-batch's fixed cost that often instead of on every trigger.
`--successor` marks the new version of an upgrade (spark_runtime/upgrade.py): a standby about
to take the output over, which runs every batch at the normal priority instead of being paced
down like a caught-up standby; a primary that handed over to one (`demote`) runs every batch
too, ready for a rollback, but at a standby's low priority.

It heartbeats to Redis (`backstop:{job}:hb:{replica}` with a TTL) and keeps its entry in
`backstop:{job}:replicas` current, publishes query progress to `backstop:{job}:progress`, and obeys
JSON commands pushed to the list `backstop:{job}:control:{replica}`:

- `{"cmd": "promote"}`: a standby becomes the primary (fences the old one, flushes its buffer);
- `{"cmd": "demote", "successor": ID, "compare": BOOL}`: a primary becomes a standby right after
  its next batch is written (or after DEMOTE_WAIT_S without one): the blue replica of an
  upgrade hands the output over to the green one, `successor`, and stays ready to take it back;
  with `compare` it checks green's results against its own and reports `result_check`
  (spark_runtime/result_check.py);
- `{"cmd": "stop"}`: stop the queries and exit 0;
- `{"cmd": "trigger", "seconds": S}`: restart the queries from their checkpoints with trigger S;
- `{"cmd": "checkpoint_interval", "seconds": CI, "confs": {KEY: VALUE}}`: take the state-store
  settings that realise checkpoint interval CI (console/policy/checkpoint.py maps CI to them);
  a query reads them when it starts, so the queries restart from their checkpoints, only if a
  setting changed. The replica then reports `checkpoint_interval_s` and `interval_since`;
- `{"cmd": "fault", "kind": "operator_exception", "after_batches": N}`: arm an operator exception
  raised in the N-th next batch (the query fails, the process exits 1);
- `{"cmd": "fault", "kind": "slow_batches", "delay_s": D, "duration_s": T}`: each batch of the
  next T seconds takes D seconds longer (a slow-driver fault: heartbeats go on, output is late).

A controller's command carries the token of its lease on the job (`"lease"`): one whose token
the job's lease no longer holds is refused and reported, not carried out
(spark_runtime.command_fence).

Exit codes: 0 stopped on request, 1 query failure, 3 fenced (another replica is primary),
4 promotion impossible. A replica that fails (a query failed, or the stage could not start its
queries) writes a one-line cause into its entry (`state: failed`, `error`) and exits at once: its
supervisor reads the cause with the exit (spark_runtime.supervision.reported_cause). When a query
failed because Spark's Python worker did not connect back, the stage asks the workers'
interpreter why (runtime.worker_start_failure): an interpreter that cannot import what a worker
needs (pyarrow, say) fails every start the same way, and its ImportError is the cause.
A stage whose checkpoint directory is full says so, with the path and the space left
(spark_runtime.disk_space): when a query fails saying "No space left on device" or with less
than the minimum free there, and before it starts its queries (then it exits within a second,
without a JVM); its supervisor restarts it with the backoff until space is back.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from spark_runtime import keys
from spark_runtime.app_output import OutputTail
from spark_runtime.app_stage import (
    AppRun,
    QueryPlans,
    install_checkpoint_defaults,
    make_app_listener,
)
from spark_runtime.command_fence import LEASE_FIELD, FenceMemory, carrying_out
from spark_runtime.config import (
    DEFAULT_REDIS_URL,
    build_session,
    configure_logging,
    ensure_python_env,
)
from spark_runtime.cpu_priority import set_group_nice
from spark_runtime.disk_space import DiskFull, disk_full_cause
from spark_runtime.env import env
from spark_runtime.failure_text import failure_cause
from spark_runtime.jobdef import registered_app
from spark_runtime.kafka_compat import install_kafka_format
from spark_runtime.progress import ProgressRecord, publish_progress
from spark_runtime.redis_client import connect
from spark_runtime.replicas import of_an_earlier_run
from spark_runtime.strategies import (
    CATCHING_UP_NICE,
    PRIMARY_NICE,
    RECOVERING_NICE,
    RECOVERY_PRIORITY_S,
    REPROTECTING_NICE,
    STANDBY_BATCH_EVERY_S,
    STANDBY_NICE,
    START_RETRY_NICE,
)

log = logging.getLogger("spark_runtime.stage")

HEARTBEAT_INTERVAL = 0.5
RUNNING, CATCHING_UP = "running", "catching_up"
# A standby more than this many seconds of input behind its primary reports `catching_up` and is
# not promoted (the supervisor restarts the primary instead): promoting it would stall the output
# for as long as it takes to catch up, e.g. a new standby replaying the input from the start. The
# bound is what a local restart costs anyway (a new driver and SparkSession, 10-15 s here, then
# the replay since its last commit): a standby nearer than that is the faster way back, even a
# low-priority one that fell a few batches behind while the CPU was busy.
CAUGHT_UP_S = 15.0
# A demotion waits for the replica's next batch (its last write is then the moment it hands
# over) at most this long: a trigger interval and a slow batch; with idle input none comes.
DEMOTE_WAIT_S = 2.0
HEARTBEAT_TTL_MS = 3000
EXIT_STOPPED, EXIT_FAILED, EXIT_FENCED, EXIT_PROMOTION = 0, 1, 3, 4


def parse_params(items: list[str]) -> dict[str, dict]:
    """`["aggregate.keys=10"]` -> `{"aggregate": {"keys": "10"}}` (topology param overrides)."""
    overrides: dict[str, dict] = {}
    for item in items:
        target, _, value = item.partition("=")
        op, _, key = target.partition(".")
        if not (op and key and value):
            raise ValueError(f"bad --param {item!r}: expected OP.KEY=VALUE")
        overrides.setdefault(op, {})[key] = value
    return overrides


def build_parser() -> argparse.ArgumentParser:
    """The stage CLI."""
    parser = argparse.ArgumentParser(prog="python -m spark_runtime.stage", description=__doc__)
    parser.add_argument("--job", required=True)
    parser.add_argument(
        "--topology", required=True, help="a built-in topology, or NAME@VERSION of a user job"
    )
    parser.add_argument("--stage", required=True)
    parser.add_argument("--operators", required=True, help="the stage's operators, comma-separated")
    parser.add_argument("--role", choices=("primary", "standby"), default="primary")
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--node", default=socket.gethostname())
    parser.add_argument("--redis-url", default=env("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--seed-from", default=None, help="checkpoint to copy before a first start")
    parser.add_argument("--cpu-priorities", action="store_true")
    parser.add_argument("--recovery-first", action="store_true")
    parser.add_argument(
        "--successor", action="store_true", help="an upgrade's new version: never paced down"
    )
    parser.add_argument(
        "--trigger-seconds", type=float, default=None, help="default: the topology's"
    )
    parser.add_argument("--max-records", type=int, default=5000)
    parser.add_argument(
        "--light-input-wait-s",
        type=float,
        default=0.0,
        help="hold light input up to S seconds before a batch reads it (0: never)",
    )
    parser.add_argument("--buffer-max", type=int, default=200_000)
    parser.add_argument("--param", action="append", default=[])
    parser.add_argument("--checkpoint-interval", type=float, default=None)
    parser.add_argument(
        "--spark-conf", action="append", default=[], help="KEY=VALUE, state-store settings only"
    )
    return parser


# Settings the controller may change on a running stage: the state store's checkpointing.
INTERVAL_CONF_PREFIX = "spark.sql.streaming.stateStore."


def interval_confs(items) -> dict[str, str]:
    """`["k=v"]` (CLI) or `{"k": "v"}` (command) -> a dict of state-store settings; anything
    outside spark.sql.streaming.stateStore.* is refused (a stage does not take arbitrary Spark
    settings from a message)."""
    pairs = items.items() if isinstance(items, dict) else (i.partition("=")[::2] for i in items)
    confs = {str(k): str(v) for k, v in pairs}
    bad = sorted(k for k in confs if not k.startswith(INTERVAL_CONF_PREFIX) or not confs[k])
    if bad:
        raise ValueError(f"refused settings {bad}: only {INTERVAL_CONF_PREFIX}*=VALUE")
    return confs


class ReplicaState:
    """What this replica reports about itself (the value in the replicas hash)."""

    def __init__(self, client, args):
        self.client = client
        self.job = args.job
        self.replica = args.replica_id
        self.info = {
            "replica": args.replica_id,
            "stage": args.stage,
            "role": args.role,
            "pid": os.getpid(),
            "node": args.node,
            "host": socket.gethostname(),
            "state": "starting",
            "epoch": None,
            "started_at": time.time(),
        }
        self.lock = threading.Lock()
        self.publishing = threading.Lock()

    def count_batch(self) -> int:
        """One more finished batch (published with the next heartbeat): the supervisor learns
        that a restarted replica is producing again. Returns the count so far."""
        with self.lock:
            self.info["batches"] = self.info.get("batches", 0) + 1
            return self.info["batches"]

    def note(self, **fields) -> None:
        """Change fields, published with the next heartbeat."""
        with self.lock:
            self.info.update(fields)

    def update(self, **fields) -> None:
        """Change fields and publish the entry right away."""
        with self.lock:
            self.info.update(fields)
        self.publish()

    def publish(self) -> None:
        """Write the entry to the replicas hash and refresh the heartbeat key."""
        # One publish at a time (heartbeat thread and main thread): a beat that read the entry
        # before an update must not write it, or a pace the update lifted, after the update.
        with self.publishing:
            with self.lock:
                self.info["updated"] = time.time()
                payload = json.dumps(self.info)
                pace_s = self.info.get("batch_every_s")
            pipe = self.client.pipeline(transaction=False)
            pipe.hset(keys.replicas(self.job), self.replica, payload)
            pipe.set(keys.heartbeat(self.job, self.replica), payload, px=HEARTBEAT_TTL_MS)
            # The pace lives as long as the heartbeat: a replica that stops renewing it (hung,
            # killed) leaves its queries reading on every trigger.
            pace = keys.batch_pace(self.job, self.replica)
            if pace_s is not None:
                pipe.set(pace, pace_s, px=HEARTBEAT_TTL_MS)
            else:
                pipe.delete(pace)
            pipe.execute()


def report_failure(state: ReplicaState, cause: str, fenced: bool = False) -> None:
    """Write the replica's failure and its one-line cause into its entry, for the supervisor
    (best effort: Redis may be what failed)."""
    import redis

    try:
        state.update(state="fenced" if fenced else "failed", error=cause, failed_at=time.time())
    except redis.exceptions.RedisError as exc:
        log.warning("could not report the failure (%s): %s", cause, exc)


def heartbeat_loop(state: ReplicaState, stop: threading.Event) -> None:
    """Refresh the heartbeat until `stop` is set; a Redis hiccup only skips a beat."""
    import redis

    while not stop.wait(HEARTBEAT_INTERVAL):
        try:
            state.publish()
        except redis.exceptions.RedisError as exc:
            log.warning("heartbeat failed: %s", exc)


def make_listener(client, job: str, state: ReplicaState, runtime):
    """A StreamingQueryListener that publishes every progress event of this process to Redis and
    tells the output gate when a query is idle (it has read all the input there is). Its events
    cross from the JVM as JSON (spark_runtime/listener.py says why)."""
    from spark_runtime.listener import JsonProgressListener

    class ProgressPublisher(JsonProgressListener):
        def onQueryStarted(self, event):
            return None

        def onQueryIdle(self, event):
            name = runtime.query_name_by_id(str(event.id))
            if name is not None:
                runtime.gate.note_idle(name)

        def onQueryTerminated(self, event):
            return None

        def onQueryProgress(self, event):
            first = state.count_batch() == 1
            progress = event.progress
            if first:
                # The end of a recovery's catch-up phase (console/policy/recovery_phases.py).
                state.note(first_batch_at=time.time())
                # Where a replica's first batch spends its time (planning, source offsets,
                # state loading in addBatch) is what a restart or a new standby waits for.
                log.info(
                    "first batch %s of %s took %s ms: %s",
                    progress.batchId,
                    progress.name,
                    progress.batchDuration,
                    dict(progress.durationMs),
                )
            segment = progress.name.rsplit(".", 1)[-1] if progress.name else ""
            stats = runtime.gate.batch_stats.get(f"{progress.name}:{progress.batchId}", {})
            latency = stats.get("latency", {})
            record = ProgressRecord.of_batch(
                progress,
                replica=state.replica,
                stage=state.info["stage"],
                # The role the batch was written or buffered as, not the one now: a primary
                # demoted right after its batch was written reports that batch as written.
                role=stats.get("role", runtime.gate.role),
                node=state.info["node"],
                query=progress.name or "",
                segment=segment,
                rows_out=stats.get("rows_out", 0),
                written=stats.get("written", 0),
                final=stats.get("final", False),
                buffered=stats.get("buffered", 0),
                latency_p50=latency.get("p50"),
                latency_p90=latency.get("p90"),
                latency_p99=latency.get("p99"),
            )
            publish_progress(client, job, record)
            check = runtime.gate.result_check
            if check is not None:  # an upgrade's old version checking the new one's results
                state.note(result_check=check.report())

    return ProgressPublisher()


def readiness(gate) -> str:
    """`running`, or `catching_up` for a standby too far behind its primary to take over."""
    return RUNNING if gate.caught_up(CAUGHT_UP_S) else CATCHING_UP


def wanted_nice(
    cpu_priorities: bool,
    role: str,
    ready: str,
    started: bool,
    successor: bool = False,
    recovering: bool = False,
    seeded: bool = False,
    recovery_first: bool = False,
    start_retried: bool = False,
) -> int:
    """The nice level of this replica's processes under the strategy's CPU priorities
    (`cpu_priorities`; else the normal level): a primary runs above the normal priority, a
    standby that is starting or catching up at it, and a caught-up standby below it, unless it
    is an upgrade's new version about to take over (`successor`): at the normal level it keeps
    up with the primary it replaces.

    started: the standby has run a batch or found its input idle. Before that its query is
    starting, and Spark gives the Python worker of its source a fixed 10 s to connect back: a
    standby niced at launch (caught up, as its primary had written nothing yet) failed that
    again and again on a busy machine (fresh-clone CI runs, 2026-11-23).

    Recovery first: under a strategy with the recovery class (`recovery_first`), a primary
    `recovering` (it took over within RECOVERY_PRIORITY_S: `recovering_since`) runs at
    RECOVERING_NICE; under one with CPU priorities, a `seeded` standby catching up (it
    re-protects a stage that ran) at REPROTECTING_NICE, both above steady primaries. A strategy
    without steady levels may still have the recovery class (local-restart), so that its
    restarts do not wait behind other jobs' steady primaries.

    `start_retried`: a standby's queries missed Spark's 10 s for the source's Python worker to
    connect back and are starting again; until its first batch (`started`), under CPU
    priorities, it runs at START_RETRY_NICE, above steady primaries. (A primary already runs
    above the standbys' start; `started` says nothing of a primary, which measures no lag.)"""
    if role == "primary" and recovering and recovery_first:
        return RECOVERING_NICE
    if not cpu_priorities:
        return 0
    if role == "standby" and start_retried and not started:
        return START_RETRY_NICE
    if role == "primary":
        return PRIMARY_NICE
    if not started or successor:
        return 0
    if ready == CATCHING_UP:
        return REPROTECTING_NICE if seeded else CATCHING_UP_NICE
    return STANDBY_NICE


def starting_nice(recovery_first: bool, role: str, resumed: bool, app: bool) -> int:
    """The nice level a replica starts at, until its first batch: the normal one, but for a
    primary restarted from its checkpoint (`resumed`), which restores service from its JVM's
    start, under a strategy with the recovery class: RECOVERING_NICE (wanted_nice takes over
    from there). Not an existing `app`'s: its loop (supervise_app) never sets its level again,
    and apps run under restart-all, the plain Spark baseline, anyway."""
    if recovery_first and role == "primary" and resumed and not app:
        return RECOVERING_NICE
    return 0


def recovering_since(role: str, started_at: float, resumed: bool, promoted_at) -> float | None:
    """When this replica began to restore service, or None: its promotion, or for a primary
    that resumed a checkpoint (a restart) its start."""
    if role != "primary":
        return None
    if promoted_at is not None:
        return float(promoted_at)
    return started_at if resumed else None


def is_recovering(since: float | None, now: float) -> bool:
    """Whether a replica that began to restore service at `since` still has the recovery
    class: for RECOVERY_PRIORITY_S."""
    return since is not None and now - since < RECOVERY_PRIORITY_S


def resumes_checkpoint(args) -> bool:
    """Whether this replica starts from a checkpoint that holds committed batches (a restart,
    a relaunch) or is seeded from its primary's: not a job's first start."""
    from spark_runtime.checkpoint_seed import committed_batch

    if args.seed_from:
        return True
    checkpoint = checkpoint_path(args)
    try:
        queries = [os.path.join(checkpoint, name) for name in os.listdir(checkpoint)]
    except FileNotFoundError:
        return False
    return any(committed_batch(query) is not None for query in [checkpoint, *queries])


def batch_every_s(nice: int, full_pace: bool = False) -> float | None:
    """Seconds between the batches that read new input of a replica at `nice`: a caught-up
    low-priority standby (at STANDBY_NICE) reads every STANDBY_BATCH_EVERY_S; every other
    replica on every trigger (None), and so does one side of an upgrade's hand-over
    (`full_pace`: the new version about to write, or the old one ready to write again at a
    rollback): a paced standby is up to STANDBY_BATCH_EVERY_S behind when it takes over, and
    that shows as an output gap. The old version keeps its low priority, so the new one it
    stands by for is not slowed down by it."""
    return STANDBY_BATCH_EVERY_S if nice == STANDBY_NICE and not full_pace else None


def handle_command(command: dict, runtime, state: ReplicaState) -> int | None:
    """Apply one control command; returns an exit code when the process should end."""
    from spark_runtime.runtime import PromotionError

    cmd = command.get("cmd")
    log.info("control command %s", command)
    if cmd == "stop":
        runtime.stop()
        state.update(state="stopped")
        return EXIT_STOPPED
    if cmd == "promote":
        # Lift the pace first, so that no trigger during the fencing and flush waits for it (a
        # batch that starts meanwhile waits for the gate's lock and then writes as primary).
        state.update(batch_every_s=None)
        try:
            result = runtime.gate.promote()
        except PromotionError as exc:
            log.error("promotion failed: %s", exc)
            state.update(state="promote_failed", error=str(exc), failed_at=time.time())
            return EXIT_PROMOTION
        state.update(
            role="primary",
            state="running",
            epoch=result["epoch"],
            promoted_at=time.time(),
        )
        # Its new CPU priority is set by the run loop right after this command, the one place
        # that decides a replica's level (`wanted_nice`).
        return None
    if cmd == "demote":

        def demoted(_result: dict) -> None:
            state.update(role="standby", state="running", demoted_at=time.time())
            if command.get("successor"):
                # Pass the promotion on at once (spark_runtime.upgrade.DemoteReplica).
                promote = json.dumps({"cmd": "promote", "from": state.replica})
                runtime.gate.client.rpush(keys.control(runtime.job, command["successor"]), promote)

        runtime.gate.demote_after_batch(
            demoted,
            compare=bool(command.get("compare")),
            comparable=runtime.writes_comparable_results(),
        )
        return None
    if cmd == "trigger":
        runtime.restart(float(command["seconds"]))
        state.update(trigger_seconds=float(command["seconds"]))
        return None
    if cmd == "checkpoint_interval":
        try:
            confs = interval_confs(command.get("confs") or {})
            seconds = float(command["seconds"])
        except (KeyError, TypeError, ValueError) as exc:
            log.error("refused %s: %s", command, exc)
            return None
        restarted = runtime.apply_confs(confs)
        state.update(checkpoint_interval_s=seconds, interval_since=time.time(), confs=confs)
        log.info("checkpoint interval %s s in effect (queries restarted: %s)", seconds, restarted)
        return None
    if cmd == "fault" and command.get("kind") == "operator_exception":
        runtime.gate.fault_after = int(command.get("after_batches", 1))
        return None
    if cmd == "fault" and command.get("kind") == "slow_batches":
        try:
            delay_s, duration_s = float(command["delay_s"]), float(command["duration_s"])
            if not (0 < delay_s < math.inf and 0 < duration_s < math.inf):
                raise ValueError("delay_s and duration_s must be positive numbers")
        except (KeyError, TypeError, ValueError) as exc:
            log.error("refused %s: %s", command, exc)
            return None
        runtime.gate.slow_down(delay_s, duration_s)
        state.update(slowed_until=runtime.gate.slow_until, batch_delay_s=delay_s)
        log.info("each batch %s s longer for %s s (slow-driver fault)", delay_s, duration_s)
        return None
    log.warning("ignored unknown command %s", command)
    return None


def run(args, spark=None, spare: str | None = None) -> int:
    """Run the replica until stopped, fenced or failed; returns the exit code. `spark` is the
    session of warm spare `spare` taking this replica over (else one is built here); the
    replica's entry names the spare (`warm_spare`), so a takeover can be told from a cold
    start."""
    client = connect(args.redis_url)
    state = ReplicaState(client, args)
    if spare is not None:
        state.note(warm_spare=spare)
    resumed = resumes_checkpoint(args)
    app = registered_app(args.topology)
    start_level = starting_nice(args.recovery_first, args.role, resumed, app is not None)
    state.update(nice=set_group_nice(start_level), resumed=resumed)
    stop_beats = threading.Event()
    beats = threading.Thread(target=heartbeat_loop, args=(state, stop_beats), daemon=True)
    beats.start()
    if app is not None:
        return run_app(args, client, state, app, stop_beats, spark)
    try:
        runtime = start_runtime(args, client, state, spark)
    except DiskFull as exc:
        log.error("stage %s does not start its queries: %s", args.stage, exc)
        stop_beats.set()
        report_failure(state, str(exc))
        client.delete(keys.heartbeat(args.job, args.replica_id))
        return EXIT_FAILED
    except Exception as exc:
        # A job module that does not import, a query that does not start: it will fail the same
        # way at the next start, so say why (the traceback goes to the log).
        log.exception("stage %s could not start its queries", args.stage)
        stop_beats.set()
        error = "".join(traceback.format_exception_only(exc))
        full = disk_full_cause(checkpoint_path(args), error)
        report_failure(state, full or failure_cause(error))
        client.delete(keys.heartbeat(args.job, args.replica_id))
        return EXIT_FAILED
    return supervise_queries(args, client, state, runtime, stop_beats)


def checkpoint_path(args) -> str:
    """The replica's checkpoint directory (`--checkpoint-dir`, else under var/checkpoints)."""
    return args.checkpoint_dir or os.path.join(
        "var", "checkpoints", args.job, args.stage, args.replica_id
    )


def start_runtime(args, client, state: ReplicaState, spark=None):
    """Build the stage's queries and start them (a StageRuntime); `spark` as for run(). Raises
    DiskFull, before anything is built, when the checkpoint directory has no room."""
    from spark_runtime.checkpoint_seed import seed_checkpoint
    from spark_runtime.jobdef import resolve_topology
    from spark_runtime.runtime import StageRuntime
    from spark_runtime.topology import stage_spec, with_params

    topology = with_params(resolve_topology(args.topology), parse_params(args.param))
    operators = [o for o in args.operators.split(",") if o]
    stage = stage_spec(topology, args.stage, operators, job=args.job)
    checkpoint = checkpoint_path(args)
    full = disk_full_cause(checkpoint)
    if full is not None:
        raise DiskFull(full)
    if args.seed_from:
        seeded = seed_checkpoint(args.seed_from, checkpoint, len(stage.segments))
        state.update(seeded_batches=seeded)
    if spark is None:
        spark = build_session(f"backstop-{args.job}-{args.replica_id}")
    runtime = StageRuntime(
        spark,
        client,
        args.job,
        topology,
        stage,
        args.role,
        args.redis_url,
        checkpoint,
        trigger_seconds=topology.trigger_s
        if args.trigger_seconds is None
        else args.trigger_seconds,
        max_records=args.max_records,
        buffer_max=args.buffer_max,
        pace_key=keys.batch_pace(args.job, args.replica_id),
        replica=args.replica_id,
        light_input_wait_s=args.light_input_wait_s,
    )
    spark.streams.addListener(make_listener(client, args.job, state, runtime))
    confs = interval_confs(args.spark_conf)
    runtime.apply_confs(confs)  # before the queries start: they read them then
    runtime.start()
    if args.checkpoint_interval is not None:
        state.update(
            checkpoint_interval_s=args.checkpoint_interval, interval_since=time.time(), confs=confs
        )
    state.update(
        state=readiness(runtime.gate),
        epoch=runtime.gate.writer.epoch,
        checkpoint=checkpoint,
        state_partitions=runtime.state_partitions,
        # Names the executors of this replica on a cluster (kill-executor, kill-worker).
        spark_app=spark.sparkContext.applicationId,
        # The end of a recovery's state-restore phase (console/policy/recovery_phases.py).
        queries_started_at=time.time(),
    )
    return runtime


def supervise_queries(args, client, state: ReplicaState, runtime, stop_beats) -> int:
    """Serve the control commands and watch the queries of `runtime` until the replica is
    stopped, fenced or failed; returns the exit code."""
    from spark_runtime.runtime import CONNECT_BACK_FAILURE, worker_start_failure
    from spark_runtime.sink import FencedError

    nice = 0  # the level last asked for (set_group_nice reports the one in force)
    fence = FenceMemory()  # the newest lease tenure seen in a command
    code = EXIT_FAILED
    try:
        while True:
            if state.info["state"] in (RUNNING, CATCHING_UP):
                ready = readiness(runtime.gate)
                lag = runtime.gate.standby_lag_s
                full_pace = args.successor or runtime.gate.handed_over
                since = recovering_since(
                    runtime.gate.role,
                    state.info["started_at"],
                    state.info.get("resumed", False),
                    state.info.get("promoted_at"),
                )
                wanted = wanted_nice(
                    args.cpu_priorities,
                    runtime.gate.role,
                    ready,
                    lag is not None,
                    args.successor,
                    recovering=is_recovering(since, time.time()),
                    seeded=bool(args.seed_from),
                    recovery_first=args.recovery_first,
                    start_retried=runtime.start_retries > 0,
                )
                pace = batch_every_s(wanted, full_pace)
                if (
                    ready != state.info["state"]
                    or wanted != nice
                    or pace != state.info.get("batch_every_s")
                ):
                    nice = wanted
                    state.update(
                        state=ready, lag_s=lag, nice=set_group_nice(nice), batch_every_s=pace
                    )
                elif lag != state.info.get("lag_s"):
                    state.update(lag_s=lag)  # a standby's lag, current after each batch
            runtime.gate.demote_if_overdue(DEMOTE_WAIT_S)
            popped = client.blpop([keys.control(args.job, args.replica_id)], timeout=0.5)
            if popped:
                command = json.loads(popped[1])
                with carrying_out_command(client, fence, args, command) as accepted:
                    result = handle_command(command, runtime, state) if accepted else None
                if result is not None:
                    code = result
                    break
            failure = runtime.failure()
            if failure is None:
                continue
            message = str(failure)
            broken = None
            if CONNECT_BACK_FAILURE in message:
                # Slow to start (start the queries again) or unable to (fail now, saying why)?
                broken = worker_start_failure(runtime.spark.sparkContext.pythonExec)
            fenced = FencedError.__name__ in message or "FENCED" in message
            # A full checkpoint disk (the error says so, or there is no room left): say which.
            full = None if fenced else disk_full_cause(runtime.checkpoint_dir, message)
            if broken is None and full is None and runtime.retry_failed_start(failure):
                continue
            code = EXIT_FENCED if fenced else EXIT_FAILED
            log.error("query failed (%s): %s", "fenced" if fenced else "error", message)
            if broken is not None:
                log.error("the Python workers' interpreter cannot start:\n%s", broken)
            if full is not None:
                log.error("the stage's disk is full: %s", full)
            report_failure(state, full or failure_cause(broken or message), fenced)
            break
    finally:
        stop_beats.set()
        runtime.stop()
        client.delete(
            keys.heartbeat(args.job, args.replica_id), keys.batch_pace(args.job, args.replica_id)
        )
    return code


# An app that has started no query this long after its script began is reported as such (it
# may still start one later: only a script that returned without one fails at once).
APP_FIRST_QUERY_S = 120.0


def app_arguments(client, job: str) -> list[str]:
    """The app's `sys.argv[1:]`: the job's `args`, recorded at launch (keys.app_args)."""
    raw = client.get(keys.app_args(job))
    return [str(a) for a in json.loads(raw)] if raw else []


def run_app(args, client, state: ReplicaState, app, stop_beats, spark=None) -> int:
    """Run an existing app (spark_runtime/app_stage.py) as this replica: build the session,
    start the app's script, then watch it until it is stopped or fails; returns the exit
    code. A failure is reported with its one-line cause (the app's file and line, or the
    failed query's error) before the process exits."""
    checkpoint = checkpoint_path(args)
    try:
        full = disk_full_cause(checkpoint)
        if full is not None:
            raise DiskFull(full)
        if spark is None:
            spark = build_session(f"backstop-{args.job}-{args.replica_id}")
    except Exception as exc:
        # No room for checkpoints, or no session (a JVM that does not start): the next start
        # meets the same, so say why.
        log.exception("app %s does not start", app.path)
        stop_beats.set()
        report_failure(state, str(exc) if isinstance(exc, DiskFull) else failure_cause(str(exc)))
        client.delete(keys.heartbeat(args.job, args.replica_id))
        return EXIT_FAILED
    output = OutputTail(client, args.job, args.replica_id)
    output.start()
    run = AppRun(spark, app, app_arguments(client, args.job))
    spark.streams.addListener(
        make_app_listener(
            client, args.job, args.replica_id, args.stage, args.node, run, state.count_batch
        )
    )
    install_checkpoint_defaults(checkpoint)
    install_kafka_format(spark)
    log.info("running app %s with arguments %s", app.path, run.args)
    run.start()
    state.update(
        state=RUNNING,
        role="primary",
        checkpoint=checkpoint,
        app=app.path,
        spark_app=spark.sparkContext.applicationId,
    )
    try:
        return supervise_app(args, client, state, run, stop_beats, output)
    finally:
        output.stop()


def app_failure(run: AppRun, started_at: float, now: float) -> str | None:
    """Why the app failed, in one line, or None while it runs well: a query failed (its
    error), the app raised (its file and line), the app's script ended with no query left
    running, or it has started no query for APP_FIRST_QUERY_S."""
    failed = run.query_failure()
    if failed is not None:
        name, error = failed
        return f"query {name} of {run.app.path} failed: {failure_cause(error)}"
    cause = run.app_failure()
    if cause is not None:
        return cause
    if run.finished.is_set() and not run.queries():
        if run.started_queries == 0:
            return f"{run.app.path}: the app ended without starting a streaming query"
        return f"{run.app.path}: the app ended and its queries stopped"
    if run.started_queries == 0 and now - started_at > APP_FIRST_QUERY_S:
        return f"{run.app.path}: no streaming query started within {APP_FIRST_QUERY_S:.0f} s"
    return None


def supervise_app(
    args, client, state: ReplicaState, run: AppRun, stop_beats, output: OutputTail
) -> int:
    """Serve the control commands (stop; the other commands act on Backstop's own queries and
    are ignored), publish each query's stateful operators once it has a plan, and watch the
    app until it is stopped or fails; returns the exit code."""
    fence = FenceMemory()
    plans = QueryPlans(client, args.job, run)
    started_at = time.time()
    code = EXIT_FAILED
    try:
        while True:
            plans.publish_new()
            popped = client.blpop([keys.control(args.job, args.replica_id)], timeout=0.5)
            if popped:
                command = json.loads(popped[1])
                with carrying_out_command(client, fence, args, command) as accepted:
                    if accepted and app_command_stops(command, run, state):
                        code = EXIT_STOPPED
                        break
            if run.stopping:
                continue
            state.note(query_batches=run.batches_by_query())  # with the next heartbeat
            cause = app_failure(run, started_at, time.time())
            if cause is None:
                continue
            log.error("app failed: %s\n%s", cause, run.error_text())
            output.add_text("stderr", f"{cause}\n{run.error_text()}")
            report_failure(state, cause)
            break
    finally:
        stop_beats.set()
        if code != EXIT_STOPPED:
            run.stop()
        client.delete(
            keys.heartbeat(args.job, args.replica_id), keys.batch_pace(args.job, args.replica_id)
        )
    return code


def app_command_stops(command: dict, run, state) -> bool:
    """Carry out a control command for an app's run; True when it stopped the app's queries
    (a stop). An app runs its own queries: other commands are ignored."""
    sent_at = command.get("sent_at")
    if sent_at is not None and of_an_earlier_run(sent_at, state.info["started_at"]):
        # An upgrade's stop, sent to the run before this one (which ended first): obeyed, it
        # would stop the version that just started.
        log.warning("ignored command %s: sent before this process started", command)
        return False
    if command.get("cmd") != "stop":
        log.warning("ignored command %s: an app runs its own queries", command)
        return False
    log.info("control command %s: stopping the app's queries", command)
    run.stop()
    state.update(state="stopped")
    return True


@contextmanager
def carrying_out_command(client, fence: FenceMemory, args, command: dict) -> Iterator[bool]:
    """Whether to carry out `command`: a controller's only while its lease token is still the
    job's lease, which stays put while the body carries it out
    (spark_runtime.command_fence.carrying_out)."""
    with carrying_out(
        client, fence, args.job, command.get(LEASE_FIELD), f"stage {args.replica_id}",
        str(command.get("cmd")),
    ) as verdict:  # fmt: skip
        yield verdict.accepted


def exit_now(code: int) -> NoReturn:
    """End the process with `code` now, once its output is flushed. After its queries ended a
    stage has nothing left to do, but a normal interpreter exit waits for Spark's threads and
    the JVM: the replica stayed alive, silent, for a second or more, and its supervisor saw a
    missed heartbeat before the exit. The JVM ends on its own when its parent is gone."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m spark_runtime.stage`."""
    configure_logging()
    ensure_python_env()
    args = build_parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    exit_now(main())
