"""Failover and restart-backoff strategies (spark_runtime/failover.py).

A strategy with a new failure behaviour is one Strategy entry plus one FailoverStrategy class:
the strategies here are defined in this file only, registered in the strategy table for the
length of a test, and drive a real Supervisor through events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest

from spark_runtime.failover import (
    ExponentialDelayRestartBackoff,
    FailoverStrategy,
    Restart,
    RestartPolicy,
    TakeOver,
)
from spark_runtime.replicas import (
    PRIMARY,
    RUNNING,
    HeartbeatSeen,
    KillReplica,
    ProcessExited,
    PromoteStandby,
    Replica,
    RestartJob,
    RestartStage,
    ScheduleRestart,
    StartReplica,
)
from spark_runtime.strategies import ALL_STANDBYS, NO_STANDBYS, STRATEGY_TABLE, Strategy
from spark_runtime.supervision import Supervisor
from spark_runtime.topology import CHAINED, PER_STATEFUL

NODES = ["node-1", "node-2", "node-3"]


@dataclass(frozen=True)
class RestartDownstreamFailover(FailoverStrategy):
    """The failed stage's primary restarts, and so do the primaries of the stages after it."""

    def on_failure(self, sup: Supervisor, failed: Replica) -> Restart:
        downstream = sup.stages[sup.stages.index(failed.spec.stage) :]
        return Restart(tuple(r.id for stage in downstream for r in sup.of_stage(stage, PRIMARY)))


@dataclass(frozen=True)
class PromoteElseRestartJobFailover(FailoverStrategy):
    """A caught-up standby takes over a failed primary; any other failure restarts the job."""

    promotes: ClassVar[bool] = True

    def on_failure(self, sup: Supervisor, failed: Replica) -> Restart | TakeOver:
        standby = sup.standby_of(failed.spec.stage)
        if failed.role == PRIMARY and standby is not None and standby.state == RUNNING:
            return TakeOver(standby.id)
        return Restart(tuple(sup.replicas), whole_job=True)


def strategy(name: str, on_failure: FailoverStrategy, standbys: str, chaining: str) -> Strategy:
    return Strategy(
        name=name,
        label=f"{name} (test only)",
        chaining=chaining,
        standbys=standbys,
        policy_moves_standbys=False,
        on_failure=on_failure,
        seeded_standbys=False,
        warm_spares=False,
        cpu_priorities=False,
        recovery_first=False,
    )


RESTART_DOWNSTREAM = strategy(
    "test-restart-downstream", RestartDownstreamFailover(), NO_STANDBYS, PER_STATEFUL
)
PROMOTE_ELSE_RESTART_JOB = strategy(
    "test-promote-else-restart-job", PromoteElseRestartJobFailover(), ALL_STANDBYS, CHAINED
)


@pytest.fixture
def test_strategies(monkeypatch):
    """The two strategies above in the strategy table, for one test (restored after it)."""
    for entry in (RESTART_DOWNSTREAM, PROMOTE_ELSE_RESTART_JOB):
        monkeypatch.setitem(STRATEGY_TABLE, entry.name, entry)


def running(sup: Supervisor, at: float) -> None:
    for replica in list(sup.replicas.values()):
        sup.handle(HeartbeatSeen(replica.id, at, {"state": "running", "role": replica.role}))


def snapshot_round_trip(sup: Supervisor) -> Supervisor:
    return Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))


def test_every_strategy_of_the_table_names_its_failover_strategy():
    for entry in STRATEGY_TABLE.values():
        assert isinstance(entry.on_failure, FailoverStrategy), entry.name


def test_a_strategy_defined_outside_the_code_restarts_the_failed_stage_and_its_downstream(
    test_strategies,
):
    stages = {"split": ("split",), "count": ("count",), "sink": ("sink",)}
    sup = Supervisor("j", "wordcount", stages, RESTART_DOWNSTREAM.name, NODES)
    started = sup.start(0.0)
    assert [(a.replica.replica_id, a.replica.role) for a in started] == [
        ("split-1", "primary"),
        ("count-1", "primary"),
        ("sink-1", "primary"),
    ]
    running(sup, at=1.0)
    # count fails: count and sink (after it) restart from their checkpoints, split keeps running.
    assert sup.handle(ProcessExited("count-1", 5.0, -9)) == [
        RestartStage(sup.replicas["count-1"].spec),
        RestartStage(sup.replicas["sink-1"].spec),
    ]
    assert sup.replicas["split-1"].state == "running"
    # The machine survives a snapshot with the strategy it was given.
    sup = snapshot_round_trip(sup)
    # count fails again before it finished a batch: both wait 2 s (the default initial delay).
    running(sup, at=6.0)
    assert sup.handle(ProcessExited("count-1", 7.0, 1)) == [
        ScheduleRestart("count-1", "count", 9.0, 2.0),
        ScheduleRestart("sink-1", "sink", 9.0, 2.0),
    ]
    assert sup.tick(8.9) == []
    assert sup.tick(9.0) == [
        RestartStage(sup.replicas["count-1"].spec),
        RestartStage(sup.replicas["sink-1"].spec),
    ]
    # The last stage has no downstream: only it restarts.
    running(sup, at=10.0)
    assert sup.handle(ProcessExited("sink-1", 11.0, -9)) == [
        RestartStage(sup.replicas["sink-1"].spec)
    ]


def test_a_strategy_defined_outside_the_code_promotes_else_restarts_the_whole_job(
    test_strategies,
):
    sup = Supervisor(
        "j", "wordcount", {"split": ("split",), "count": ("count",)},
        PROMOTE_ELSE_RESTART_JOB.name, NODES,
    )  # fmt: skip
    started = sup.start(0.0)
    assert [(a.replica.replica_id, a.replica.role) for a in started] == [
        ("split-1", "primary"),
        ("split-2", "standby"),
        ("count-1", "primary"),
        ("count-2", "standby"),
    ]
    running(sup, at=1.0)
    # A primary with a caught-up standby: the standby takes over.
    assert sup.handle(ProcessExited("count-1", 5.0, -9)) == [
        KillReplica("count-1"),
        PromoteStandby("count-2", "count"),
    ]
    (start,) = sup.handle(HeartbeatSeen("count-2", 6.0, {"role": "primary", "state": "running"}))
    assert isinstance(start, StartReplica) and start.replica.replica_id == "count-3"
    # The new primary fails before its new standby caught up: the whole job restarts.
    (restart,) = sup.handle(ProcessExited("count-2", 7.0, -9))
    assert isinstance(restart, RestartJob)
    assert [s.replica_id for s in restart.replicas] == ["split-1", "split-2", "count-2", "count-3"]
    # A strategy that promotes may be given standbys by the policy.
    assert sup.drop_standby("split") == [KillReplica("split-2")]
    assert [a.replica.replica_id for a in sup.add_standby("split", "node-3", 8.0)] == ["split-3"]


def test_the_failure_cause_reaches_the_restart_backoff_strategy(monkeypatch):
    notified = []
    notify_failure = ExponentialDelayRestartBackoff.notify_failure

    def recording(self, scope, now, cause=""):
        notified.append((scope, now, cause))
        notify_failure(self, scope, now, cause)

    monkeypatch.setattr(ExponentialDelayRestartBackoff, "notify_failure", recording)
    sup = Supervisor("j", "wordcount", {"count": ("count",)}, "local-restart", NODES)
    sup.start(0.0)
    running(sup, at=1.0)
    # The cause is what the replica reported about its failure; a killed one reported nothing.
    sup.handle(ProcessExited("count-1", 5.0, -9))
    sup.handle(ProcessExited("count-1", 6.0, 1, cause="ValueError: bad input"))
    assert notified == [("count/primary", 5.0, ""), ("count/primary", 6.0, "ValueError: bad input")]
    # The history says both how the supervisor saw the failure and what the replica said.
    assert sup.history[-2][1] == (
        "count-1 (primary of count) failed: process exited (1): ValueError: bad input"
    )


# --- the restart-backoff strategy -----------------------------------------------------------


def test_backoff_delays_grow_exponentially_up_to_the_cap():
    backoff = ExponentialDelayRestartBackoff(RestartPolicy(initial_delay_s=2, max_delay_s=60), {})
    # The first failure in a row restarts at once; then 2 s, doubled each time: 4, 8, 16, 32,
    # and 64 s is over the 60 s cap.
    delays = [backoff.backoff_s(n) for n in range(1, 9)]
    assert delays == [0, 2, 4, 8, 16, 32, 60, 60]


def test_backoff_gives_up_after_max_failures_within_the_window_per_scope():
    failures: dict[str, list[float]] = {}
    policy = RestartPolicy(max_failures=3, failure_window_s=60)
    backoff = ExponentialDelayRestartBackoff(policy, failures)
    backoff.notify_failure("count/primary", 0.0, cause="process exited (1)")
    backoff.notify_failure("count/primary", 30.0)
    assert backoff.can_restart("count/primary")
    # At 60 s the window starts at 0 s: the failure at 0 s is out of it (2 failures, not 3).
    backoff.notify_failure("count/primary", 60.0)
    assert backoff.can_restart("count/primary")
    assert failures == {"count/primary": [30.0, 60.0]}
    # Another scope is counted apart.
    backoff.notify_failure("count/standby", 61.0)
    assert backoff.can_restart("count/standby")
    # A third failure within 60 s (30, 60, 62): no more restarts.
    backoff.notify_failure("count/primary", 62.0)
    assert not backoff.can_restart("count/primary")
    assert failures == {"count/primary": [30.0, 60.0, 62.0], "count/standby": [61.0]}
