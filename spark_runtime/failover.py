"""What a failed replica leads to: failover strategies and the restart-backoff strategy.

Split as in Apache Flink's runtime (flink-runtime `executiongraph/failover/`): a failover
strategy answers which replicas restart, or which standby takes over, for a failed replica
(Flink's FailoverStrategy); a restart-backoff strategy answers whether to restart at all and
after how long (Flink's RestartBackoffTimeStrategy). The supervisor's failure handler
(spark_runtime.supervision) combines the two answers into actions.

Each strategy of spark_runtime/strategies.py names its failover strategy (`on_failure`); a new
failure behaviour is one new FailoverStrategy subclass. Pure Python: no Django, no Spark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

from spark_runtime.disk_space import is_disk_full
from spark_runtime.replicas import RUNNING, STANDBY, Replica


class ReplicaTable(Protocol):
    """What a failover strategy reads of the supervisor (spark_runtime.supervision.Supervisor):
    its replica table, as Flink's strategies read a view of the topology, not the scheduler."""

    replicas: Mapping[str, Replica]

    def of_stage(self, stage: str, role: str | None = None) -> list[Replica]:
        """Replicas of `stage` (optionally of one role) taking part in failover."""


# --- failover strategies: which replicas restart ---------------------------------------------


@dataclass(frozen=True)
class Restart:
    """Restart these replicas, each from its own checkpoint, after the backoff's delay.

    `whole_job`: they are the whole job and restart together (one RestartJob action).
    `standby_may_overtake`: the failed primary's stage has a standby still catching up; if it
    catches up before the restarted primary finishes a batch, it takes over instead.
    """

    replica_ids: tuple[str, ...]
    whole_job: bool = False
    standby_may_overtake: bool = False


@dataclass(frozen=True)
class TakeOver:
    """Promote the caught-up standby `standby_id` in place of the failed primary."""

    standby_id: str


class FailoverStrategy(ABC):
    """Which replicas restart, or which standby takes over, for a failed replica (Flink's
    FailoverStrategy). A standby that fails while it is being promoted never gets here: its
    promotion failed, and the supervisor restarts the stage's primary whatever the strategy."""

    # Standbys take over from failed primaries: the policy may add them, and a stage whose
    # standbys keep failing runs unprotected instead of failing the job.
    promotes: ClassVar[bool] = False

    @abstractmethod
    def on_failure(self, sup: ReplicaTable, failed: Replica) -> Restart | TakeOver:
        """What the failure of `failed` (a replica in `sup.replicas`) leads to."""

    def after_backoff(self, sup: ReplicaTable, due: list[Replica]) -> Restart:
        """What restarts once the backoff delay of the replicas `due` is over (here: they)."""
        return Restart(tuple(r.id for r in due))


@dataclass(frozen=True)
class RestartJobFailover(FailoverStrategy):
    """Every replica of the job restarts from its checkpoint, all together (restart-all)."""

    def on_failure(self, sup: ReplicaTable, failed: Replica) -> Restart:
        return Restart(tuple(sup.replicas), whole_job=True)

    def after_backoff(self, sup: ReplicaTable, due: list[Replica]) -> Restart:
        # The whole job waited out the delay together (every replica was in backoff).
        return Restart(tuple(sup.replicas), whole_job=True)


@dataclass(frozen=True)
class RestartStageFailover(FailoverStrategy):
    """Only the failed replica restarts, from its own checkpoint (local-restart)."""

    def on_failure(self, sup: ReplicaTable, failed: Replica) -> Restart:
        return Restart((failed.id,))


@dataclass(frozen=True)
class PromoteFailover(FailoverStrategy):
    """A failed primary's caught-up standby takes over; without one the primary restarts from
    its checkpoint. A failed standby restarts from its own."""

    promotes: ClassVar[bool] = True

    def on_failure(self, sup: ReplicaTable, failed: Replica) -> Restart | TakeOver:
        if failed.role == STANDBY:
            return Restart((failed.id,))
        standbys = sup.of_stage(failed.spec.stage, STANDBY)
        caught_up = [r for r in standbys if r.state == RUNNING]
        if caught_up:
            return TakeOver(caught_up[0].id)
        return Restart((failed.id,), standby_may_overtake=bool(standbys))


# --- the restart-backoff strategy: whether and when ------------------------------------------


@dataclass(frozen=True)
class RestartPolicy:
    """The settings of the restart-backoff strategy (ExponentialDelayRestartBackoff); the
    controller builds them from the policy in force (the console's policy fields of the same
    names with a `restart_` prefix, and `same_cause_failures_limit`)."""

    initial_delay_s: float = 2.0
    max_delay_s: float = 60.0
    max_failures: int = 8
    failure_window_s: float = 600.0
    same_cause_failures_limit: int = 3


@dataclass(frozen=True)
class CauseStreak:
    """The failures in a row of a scope that had the same cause (the last ones it had)."""

    cause: str
    count: int


def waits_for_space(cause: str) -> bool:
    """True for a failure that waits for an operator to free disk space (a replica's reported
    cause saying its checkpoint directory, or another of its disks, is full): retried with the
    backoff for as long as it lasts, never given up on (spark_runtime.disk_space)."""
    return bool(cause) and is_disk_full(cause)


class ExponentialDelayRestartBackoff:
    """Whether a failed replica may restart, and after how long: Flink's exponential-delay
    strategy with the give-up rule of its failure-rate strategy, and a give-up rule on causes.

    - Delay: the n-th failure in a row of a replica before it finished a batch waits 0 s for
      n = 1 (it may be a fault during start-up: recovery time matters), then initial_delay_s,
      doubled each time, at most max_delay_s.
    - Give up (failure rate): once a scope has failed max_failures times within
      failure_window_s.
    - Give up (same cause): once a scope has failed same_cause_failures_limit times in a row
      with the same cause, however far apart. A deterministic failure (a Python worker that
      cannot import pyarrow, a job module that raises on import) fails every start the same way;
      the delays between starts grow to max_delay_s, so the failure rate alone never reached its
      limit and such a stage restarted for ever. The cause is the one line the replica reported
      about its own failure (`cause` of notify_failure); a failure without one (a kill, a
      missed heartbeat: nothing says it will happen again), a failure with another cause, and a
      success (notify_success: a replica of the scope finished a batch) end the streak.
    - A full disk waits (`waits_for_space`): a failure whose cause says the replica's checkpoint
      directory (or another disk of it) is full counts toward neither give-up rule, and ends a
      streak. It is the same cause at every start until an operator frees space, then it is
      gone: giving up on it failed a job that only had to wait (three starts in 74 s on a full
      tmpfs, before this rule). The replica is restarted with the same exponential delay (its
      starts come max_delay_s apart once the delay reached it, each refused within a second or
      two before any JVM) and resumes its checkpoint at the first start after space is back.

    `failures` (scope -> times of its failures within the window) and `streaks` (scope -> its
    CauseStreak) belong to the caller, which persists them; this strategy records into them.
    """

    def __init__(
        self,
        policy: RestartPolicy,
        failures: dict[str, list[float]],
        streaks: dict[str, CauseStreak] | None = None,
    ):
        self.policy = policy
        self.failures = failures
        self.streaks = {} if streaks is None else streaks

    def notify_failure(self, scope: str, now: float, cause: str = "") -> None:
        """Record a failure of `scope` at `now`, forgetting those now out of the window.
        `cause`: the one line the failed replica reported about its failure ("" when it
        reported none)."""
        window_start = now - self.policy.failure_window_s
        recent = [t for t in self.failures.get(scope, []) if t > window_start]
        self.failures[scope] = recent if waits_for_space(cause) else [*recent, now]
        streak = self.streaks.get(scope)
        if not cause or waits_for_space(cause):
            self.streaks.pop(scope, None)
        elif streak is not None and streak.cause == cause:
            self.streaks[scope] = CauseStreak(cause, streak.count + 1)
        else:
            self.streaks[scope] = CauseStreak(cause, 1)

    def notify_success(self, scope: str) -> None:
        """A replica of `scope` finished a batch: a failure after this starts a new streak."""
        self.streaks.pop(scope, None)

    def repeated_cause(self, scope: str) -> CauseStreak | None:
        """The streak of `scope` once it reached same_cause_failures_limit (else None)."""
        streak = self.streaks.get(scope)
        if streak is not None and streak.count >= self.policy.same_cause_failures_limit:
            return streak
        return None

    def can_restart(self, scope: str) -> bool:
        """False once `scope` has failed max_failures times within the window, or
        same_cause_failures_limit times in a row with the same cause."""
        if self.repeated_cause(scope) is not None:
            return False
        return len(self.failures.get(scope, ())) < self.policy.max_failures

    def backoff_s(self, failures_in_a_row: int) -> float:
        """How long to wait before restarting a replica after its n-th failure in a row."""
        if failures_in_a_row <= 1:
            return 0.0
        delay = self.policy.initial_delay_s * 2 ** (failures_in_a_row - 2)
        return min(self.policy.max_delay_s, delay)
