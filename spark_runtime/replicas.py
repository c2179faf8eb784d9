"""The replica table's vocabulary: roles and states, what launches a replica, the events a
driver feeds the supervisor and the actions it returns. The bottom of supervision: the failover
strategies (failover.py), blue/green upgrades (upgrade.py) and the state machine
(supervision.py) all speak it, and it imports none of them. Pure Python: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Replica roles and states as the supervisor's replica table records them.
PRIMARY = "primary"
STANDBY = "standby"
STARTING = "starting"
RUNNING = "running"
# A standby that is up but too far behind its primary to take over (it is not promoted).
CATCHING_UP = "catching_up"
PROMOTING = "promoting"
# Failed and waiting out its restart delay; no process runs.
BACKOFF = "backoff"
FAILED = "failed"


# Replica entries carry their process's start time from the node's clock; allow this much skew
# when telling a restarted process from the one that failed.
CLOCK_SLACK_S = 1.0


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything needed to launch one replica (the stage CLI arguments)."""

    job: str
    topology: str
    stage: str
    role: str
    replica_id: str
    node: str
    operators: tuple[str, ...] = ()  # the stage's processing operators (its chain)
    params: tuple[str, ...] = ()  # "OP.KEY=VALUE" overrides
    # A new standby starts from a copy of this replica's latest committed checkpoint.
    seed_from: str | None = None
    # May take over a warm spare process of its node (a launcher's hint).
    warm: bool = False
    # The strategy's CPU priorities: a primary above the normal level, a standby below it
    # (strategies.PRIMARY_NICE, STANDBY_NICE).
    cpu_priorities: bool = False
    # The strategy's recovery class: a primary that restores service runs above steady work
    # for a while (strategies.RECOVERING_NICE), also where `cpu_priorities` is off.
    recovery_first: bool = False
    # The new version of an upgrade (spark_runtime/upgrade.py): run at full pace as a standby.
    successor: bool = False

    def argv(self) -> list[str]:
        """Arguments of `python -m spark_runtime.stage` for this replica (the launcher adds the
        checkpoint paths, see runner.stage_args)."""
        args = ["--job", self.job, "--topology", self.topology, "--stage", self.stage]
        args += ["--role", self.role, "--replica-id", self.replica_id, "--node", self.node]
        args += ["--operators", ",".join(self.operators)]
        if self.cpu_priorities:
            args.append("--cpu-priorities")
        if self.recovery_first:
            args.append("--recovery-first")
        if self.successor:
            args.append("--successor")
        for param in self.params:
            args += ["--param", param]
        return args


# --- events ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeartbeatSeen:
    """The replica's heartbeat is fresh; `reported` is its replicas-hash entry (role, state)."""

    replica_id: str
    at: float
    reported: dict = field(default_factory=dict)


@dataclass(frozen=True)
class HeartbeatMissed:
    """The replica's heartbeat key has expired; `busy` when its agent sees the process alive
    and using CPU (slow, not dead). `cause`: the failure the replica reported ("" if none)."""

    replica_id: str
    at: float
    busy: bool = False
    cause: str = ""


@dataclass(frozen=True)
class ProcessExited:
    """The replica's process is gone (exit code if known). `cause`: the failure the replica
    reported before it exited ("" if none: killed, or it died without a word)."""

    replica_id: str
    at: float
    code: int | None = None
    cause: str = ""


# The states in which a replica's own entry may carry the cause of its failure (`error`): it
# wrote `failed`, `fenced` or `promote_failed`; a driver marks an entry `lost` (keeping its error)
# once it saw the process gone or silent.
REPORTED_FAILURE_STATES = ("failed", "fenced", "promote_failed", "lost")


def of_an_earlier_run(started_at: float, launched_at: float) -> bool:
    """Whether a process that became the replica at `started_at` (its node's clock) ran before
    the replica was last asked for at `launched_at` (the controller's): news about it, such as
    its last heartbeat or its exit reported after the relaunch, says nothing of the process now
    starting."""
    return started_at < launched_at - CLOCK_SLACK_S


def reported_cause(entry: Mapping | None, launched_at: float) -> str:
    """The one-line cause a replica reported about its failure in its replicas-hash `entry`
    (its `error`), if the entry says the replica failed and is of the process asked for at
    `launched_at`; "" otherwise.

    An earlier run of the same replica id leaves its entry until the new process overwrites it:
    that process started before the relaunch (`started_at`, within the clock slack), and one
    that failed within the slack of its start failed before the relaunch (`failed_at`): the
    supervisor relaunches a replica after seeing it fail. Taken as news, its cause failed the
    new process at once."""
    if not entry or entry.get("state") not in REPORTED_FAILURE_STATES:
        return ""
    started_at, failed_at = entry.get("started_at"), entry.get("failed_at")
    if started_at is None or of_an_earlier_run(started_at, launched_at):
        return ""
    if failed_at is None or failed_at < launched_at:
        return ""
    return str(entry.get("error") or "")


# --- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartReplica:
    """Launch a new replica (fresh, or resuming its own checkpoint if it has one)."""

    replica: ReplicaSpec


@dataclass(frozen=True)
class KillReplica:
    """Make sure the replica's process is gone."""

    replica_id: str


@dataclass(frozen=True)
class PromoteStandby:
    """Tell a standby to take over as primary."""

    replica_id: str
    stage: str


@dataclass(frozen=True)
class RestartStage:
    """Kill the replica if needed and launch it again from its own checkpoint."""

    replica: ReplicaSpec


@dataclass(frozen=True)
class RestartJob:
    """Kill every replica of the job and launch them again from their checkpoints."""

    replicas: tuple[ReplicaSpec, ...]


@dataclass(frozen=True)
class ScheduleRestart:
    """Make sure the replica is gone; `Supervisor.tick` restarts it at `at` (a backoff)."""

    replica_id: str
    stage: str
    at: float
    delay_s: float
    whole_job: bool = False  # restart-all: the whole job restarts together then


# GiveUp scopes.
JOB = "job"
STANDBY_PROTECTION = "standby"


@dataclass(frozen=True)
class GiveUp:
    """Stop restarting. Scope JOB: every replica is killed (the KillReplica actions before this
    one) and the driver marks the job failed with `reason`. Scope STANDBY_PROTECTION: `stage`
    runs without a standby from now on; its primary keeps serving."""

    stage: str
    scope: str
    reason: str


@dataclass
class Replica:
    """The supervisor's view of one replica."""

    spec: ReplicaSpec
    state: str
    since: float
    launched_at: float = 0.0  # when its current process was asked for
    healthy: bool = False  # finished a batch since launched_at
    failures_in_a_row: int = 0  # failures since it last finished a batch
    retry_at: float | None = None  # in BACKOFF: when tick() restarts it
    slow_since: float | None = None  # silent but busy since then (see the module doc)

    @property
    def id(self) -> str:
        return self.spec.replica_id

    @property
    def role(self) -> str:
        return self.spec.role


def relaunched(replica: Replica, now: float) -> None:
    """`replica`'s process is asked for again: it is starting and not yet healthy."""
    replica.state, replica.since, replica.launched_at = STARTING, now, now
    replica.healthy, replica.retry_at = False, None
