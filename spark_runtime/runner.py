"""The local runner: starts a job's stage processes on this machine and supervises them with the
state machine of `supervision.py` (no Django, no Celery).

    python -m spark_runtime run --topology wordcount --job demo --strategy local-restart
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from spark_runtime import keys
from spark_runtime.activity import cpu_share_over, is_busy
from spark_runtime.config import stage_env_overrides
from spark_runtime.jobdef import resolve_topology
from spark_runtime.launch import STAGE_MODULE, start_stage_process
from spark_runtime.replicas import (
    HeartbeatMissed,
    HeartbeatSeen,
    ProcessExited,
    ReplicaSpec,
    reported_cause,
)
from spark_runtime.strategies import get_strategy
from spark_runtime.supervision import RestartPolicy, Supervisor, execute
from spark_runtime.topology import compile_stages

log = logging.getLogger(__name__)

DEFAULT_NODES = ("node-1", "node-2", "node-3")


def stage_args(
    replica: ReplicaSpec,
    redis_url: str,
    checkpoint_root: str,
    trigger_seconds: float,
    max_records: int = 5000,
    checkpoint_interval_s: float | None = None,
    spark_conf: dict[str, str] | None = None,
    light_input_wait_s: float = 0.0,
) -> list[str]:
    """The arguments of `python -m spark_runtime.stage` for a replica, with its checkpoint at
    `{checkpoint_root}/{job}/{stage}/{replica}` (the same replica id resumes the same checkpoint;
    a seeded standby copies its primary's from the same layout). Shared by every launcher (local
    subprocesses here, node agents in the controller). `checkpoint_interval_s` and `spark_conf`
    (the state-store settings realising it) start the replica with its stage's interval.
    `light_input_wait_s`: how long its sources may hold light input (the policy's; 0: never)."""
    stage_root = os.path.join(checkpoint_root, replica.job, replica.stage)
    checkpoint = os.path.join(stage_root, replica.replica_id)
    seed = ["--seed-from", os.path.join(stage_root, replica.seed_from)] if replica.seed_from else []
    return [
        *seed,
        *replica.argv(),
        "--redis-url",
        redis_url,
        "--checkpoint-dir",
        checkpoint,
        "--trigger-seconds",
        str(trigger_seconds),
        "--max-records",
        str(max_records),
        *(["--checkpoint-interval", str(checkpoint_interval_s)] if checkpoint_interval_s else []),
        *(arg for k, v in (spark_conf or {}).items() for arg in ("--spark-conf", f"{k}={v}")),
        *(["--light-input-wait-s", str(light_input_wait_s)] if light_input_wait_s else []),
    ]


class SubprocessLauncher:
    """A `Launcher` running each replica as `python -m spark_runtime.stage` on this machine.

    Node names are only labels here (every "node" is this machine). Standbys can be started at a
    lower CPU priority (`standby_nice`), the knob between primary latency and failover gap; a
    low-priority standby (the strategy's choice) also renices itself while it catches up.
    """

    def __init__(
        self,
        redis_url: str,
        checkpoint_root: str,
        log_dir: str,
        trigger_seconds: float = 0.5,
        max_records: int = 5000,
        standby_nice: int = 0,
        light_input_wait_s: float = 0.0,
    ):
        self.redis_url = redis_url
        self.light_input_wait_s = light_input_wait_s
        self.checkpoint_root = checkpoint_root
        self.log_dir = log_dir
        self.trigger_seconds = trigger_seconds
        self.max_records = max_records
        self.standby_nice = standby_nice
        self.processes: dict[str, subprocess.Popen] = {}

    def arguments(self, replica: ReplicaSpec) -> list[str]:
        """The arguments of a replica's `python -m spark_runtime.stage`."""
        return stage_args(
            replica,
            self.redis_url,
            self.checkpoint_root,
            trigger_seconds=self.trigger_seconds,
            max_records=self.max_records,
            light_input_wait_s=self.light_input_wait_s,
        )

    def start(self, replica: ReplicaSpec) -> None:
        """Launch the replica's process (its output goes to `{log_dir}/{replica}.log`)."""
        proc = start_stage_process(
            STAGE_MODULE,
            self.arguments(replica),
            Path(self.log_dir) / f"{replica.replica_id}.log",
            # The data plane's variables only: the replica runs users' code (stage_env.py).
            env_overrides=stage_env_overrides(self.redis_url),
            nice=self.standby_nice if replica.role == "standby" else 0,
        )
        self.processes[replica.replica_id] = proc
        log.info(
            "started %s (%s of %s on %s) pid %s",
            replica.replica_id,
            replica.role,
            replica.stage,
            replica.node,
            proc.pid,
        )

    def kill(self, replica_id: str) -> None:
        """SIGKILL the replica's whole process group."""
        proc = self.processes.get(replica_id)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(timeout=30)

    def alive(self, replica_id: str) -> bool:
        """True while the replica's process runs."""
        proc = self.processes.get(replica_id)
        return proc is not None and proc.poll() is None

    def exit_code(self, replica_id: str) -> int | None:
        """The exit code of a finished replica (None while it runs)."""
        proc = self.processes.get(replica_id)
        return None if proc is None else proc.poll()

    def busy(self, replica_id: str) -> bool:
        """True while the replica's process tree uses CPU (measured now, over 0.3 s)."""
        proc = self.processes.get(replica_id)
        return proc is not None and proc.poll() is None and is_busy(cpu_share_over(proc.pid))

    def pid(self, replica_id: str) -> int | None:
        """The process id of the replica's current process."""
        proc = self.processes.get(replica_id)
        return None if proc is None else proc.pid

    def kill_all(self) -> None:
        """Kill every replica started by this launcher."""
        for replica_id in list(self.processes):
            self.kill(replica_id)


def observe(supervisor: Supervisor, launcher, client, job: str, now: float) -> list:
    """Poll the live replicas once and return the events to feed the supervisor. A replica
    gone or silent comes with the cause it reported of its failure, if it wrote one (a stage
    whose query failed writes it, then exits)."""
    events = []
    watched = supervisor.live()
    pipe = client.pipeline(transaction=False)
    for replica in watched:
        pipe.get(keys.heartbeat(job, replica.id))
    beats = pipe.execute()
    gone = {r.id for r in watched if not launcher.alive(r.id)}
    silent = [r for r, beat in zip(watched, beats, strict=True) if r.id in gone or beat is None]
    entries = client.hmget(keys.replicas(job), [r.id for r in silent]) if silent else []
    causes = {
        r.id: reported_cause(json.loads(raw) if raw else None, r.launched_at)
        for r, raw in zip(silent, entries, strict=True)
    }
    for replica, beat in zip(watched, beats, strict=True):
        if replica.id in gone:
            code = launcher.exit_code(replica.id)
            events.append(ProcessExited(replica.id, now, code, cause=causes[replica.id]))
        elif beat is None:
            cause = causes[replica.id]
            # Whether it is busy only matters to a replica that said nothing (slow, not dead).
            busy = not cause and launcher.busy(replica.id)
            events.append(HeartbeatMissed(replica.id, now, busy=busy, cause=cause))
        else:
            events.append(HeartbeatSeen(replica.id, now, json.loads(beat)))
    return events


class LocalRunner:
    """Drives a `Supervisor` with a `SubprocessLauncher` until stopped."""

    def __init__(self, supervisor: Supervisor, launcher: SubprocessLauncher, client, job: str):
        self.supervisor = supervisor
        self.launcher = launcher
        self.client = client
        self.job = job

    def send_command(self, replica_id: str, command: dict) -> None:
        """Push a control command to a replica."""
        self.client.rpush(keys.control(self.job, replica_id), json.dumps(command))

    def _record(self, what: str, now: float) -> None:
        log.info("%s", what)
        self.client.xadd(
            keys.events(self.job),
            {"at": str(now), "what": what},
            maxlen=keys.EVENTS_MAXLEN,
            approximate=True,
        )

    def _mark_lost(self, replica_id: str, now: float) -> None:
        # A killed replica cannot report its own end: keep the replicas hash current for it.
        raw = self.client.hget(keys.replicas(self.job), replica_id)
        info = json.loads(raw) if raw else {"replica": replica_id}
        if info.get("state") != "lost":
            info.update(state="lost", updated=now)
            self.client.hset(keys.replicas(self.job), replica_id, json.dumps(info))

    def apply(self, actions: list, now: float) -> None:
        """Carry out actions and log them to the job's events stream."""
        for action in actions:
            self._record(f"action {action}", now)
        execute(actions, self.launcher, self.send_command)

    def start(self) -> None:
        """Launch the job."""
        self.client.delete(keys.replicas(self.job))
        self.apply(self.supervisor.start(time.time()), time.time())

    def tick(self) -> None:
        """One supervision round: restarts whose backoff is over, then observe, decide, act."""
        now = time.time()
        due = self.supervisor.tick(now)
        if due:
            self.apply(due, now)
        for event in observe(self.supervisor, self.launcher, self.client, self.job, now):
            if isinstance(event, ProcessExited | HeartbeatMissed):
                self._mark_lost(event.replica_id, now)
            actions = self.supervisor.handle(event)
            if actions:
                self._record(f"event {event}", now)
                self.apply(actions, now)
                # Other observations of this round may be stale after a restart: look again.
                return

    def run(self, duration: float | None = None, interval: float = 0.25, stop=None) -> None:
        """Supervise until `duration` elapses or `stop()` is true, then stop the job."""
        started = time.time()
        try:
            while duration is None or time.time() - started < duration:
                if stop is not None and stop():
                    break
                self.tick()
                if self.supervisor.gave_up:
                    log.error("gave up on the job: %s", self.supervisor.gave_up)
                    break
                time.sleep(interval)
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop every replica (SIGKILL: the sinks are idempotent, checkpoints stay valid)."""
        self.apply(self.supervisor.stop(), time.time())
        self.launcher.kill_all()


def build_runner(
    topology: str,
    job: str,
    strategy: str,
    redis_url: str,
    client,
    nodes=DEFAULT_NODES,
    active_stages: set[str] | None = None,
    checkpoint_root: str = "var/checkpoints",
    log_dir: str | None = None,
    trigger_seconds: float | None = None,
    max_records: int = 5000,
    standby_nice: int = 0,
    params: tuple[str, ...] = (),
    chaining: str | None = None,
    active_operators: frozenset[str] = frozenset(),
    restart_policy: RestartPolicy | None = None,
    light_input_wait_s: float = 0.0,
) -> LocalRunner:
    """Assemble a runner for `topology` under `strategy`, cut into stages by the strategy's
    chaining rule (or `chaining`); `active_operators` are the ones the policy would protect.
    `trigger_seconds`: the stages' trigger, by default the topology's. `restart_policy`: when
    to back off and give up (the defaults of RestartPolicy if None). `light_input_wait_s`: how
    long the replicas' sources may hold light input (0: a batch on every trigger with input)."""
    rule = chaining or get_strategy(strategy).chaining
    spec = resolve_topology(topology)
    stages = {s.name: s.operators for s in compile_stages(spec, rule, active=active_operators)}
    supervisor = Supervisor(
        job,
        topology,
        stages,
        strategy,
        list(nodes),
        active_stages,
        params=params,
        restart_policy=restart_policy,
    )
    launcher = SubprocessLauncher(
        redis_url,
        checkpoint_root,
        log_dir or os.path.join("var", "logs", job),
        trigger_seconds=spec.trigger_s if trigger_seconds is None else trigger_seconds,
        max_records=max_records,
        standby_nice=standby_nice,
        light_input_wait_s=light_input_wait_s,
    )
    return LocalRunner(supervisor, launcher, client, job)
