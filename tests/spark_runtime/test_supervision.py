"""The supervision state machine, driven with synthetic events (no processes, no Redis)."""

from __future__ import annotations

import json

from spark_runtime.supervision import (
    HeartbeatMissed,
    HeartbeatSeen,
    KillReplica,
    ProcessExited,
    PromoteStandby,
    RestartJob,
    RestartStage,
    StartReplica,
    Supervisor,
    execute,
)

NODES = ["node-1", "node-2", "node-3"]


def per_operator(*names):
    """Stages that each run the operator of the same name (the per-operator cut)."""
    return {name: (name,) for name in names}


def running(sup, at=1.0):
    for replica in list(sup.replicas.values()):
        sup.handle(HeartbeatSeen(replica.id, at, {"state": "running", "role": replica.role}))


def test_local_restart_restarts_only_the_failed_stage_from_its_checkpoint():
    sup = Supervisor("j", "wordcount", per_operator("split", "count"), "local-restart", NODES)
    actions = sup.start(0.0)
    assert [(a.replica.stage, a.replica.role, a.replica.node) for a in actions] == [
        ("split", "primary", "node-1"),
        ("count", "primary", "node-2"),
    ]
    running(sup)
    actions = sup.handle(ProcessExited("count-1", 5.0, -9))
    assert actions == [RestartStage(sup.replicas["count-1"].spec)]
    assert sup.replicas["count-1"].state == "starting"
    # Late news about the same failure changes nothing.
    assert sup.handle(HeartbeatMissed("count-1", 5.5)) == []


def test_heartbeat_missed_is_ignored_during_startup_grace_only():
    sup = Supervisor(
        "j", "wordcount", per_operator("split"), "local-restart", NODES, startup_grace=30
    )
    sup.start(0.0)
    assert sup.handle(HeartbeatMissed("split-1", 10.0)) == []
    assert isinstance(sup.handle(HeartbeatMissed("split-1", 31.0))[0], RestartStage)


def test_active_all_promotes_the_standby_then_starts_a_new_one_elsewhere():
    sup = Supervisor("j", "wordcount", per_operator("split", "count"), "active-all", NODES)
    actions = sup.start(0.0)
    specs = {a.replica.replica_id: a.replica for a in actions}
    assert specs["count-2"].role == "standby"
    assert specs["count-2"].node != specs["count-1"].node
    running(sup)
    actions = sup.handle(ProcessExited("count-1", 10.0, -9))
    assert actions == [KillReplica("count-1"), PromoteStandby("count-2", "count")]
    # Until the standby reports itself primary, nothing else happens.
    assert sup.handle(HeartbeatSeen("count-2", 10.5, {"role": "standby", "state": "running"})) == []
    actions = sup.handle(HeartbeatSeen("count-2", 11.0, {"role": "primary", "state": "running"}))
    (start,) = actions
    assert isinstance(start, StartReplica)
    assert start.replica.role == "standby" and start.replica.replica_id == "count-3"
    assert start.replica.node != sup.replicas["count-2"].spec.node
    assert "count-1" not in sup.replicas
    assert sup.replicas["count-2"].role == "primary"


def test_a_standby_catching_up_is_not_promoted_until_it_reports_running_again():
    sup = Supervisor("j", "wordcount", per_operator("count"), "active-all", NODES)
    sup.start(0.0)
    running(sup)
    # The standby fell far behind its primary (e.g. a new one replaying the input).
    sup.handle(HeartbeatSeen("count-2", 2.0, {"role": "standby", "state": "catching_up"}))
    assert sup.replicas["count-2"].state == "catching_up"
    assert not sup.all_running()
    # Lagging but alive: a missed heartbeat is a failure, not start-up grace.
    assert isinstance(sup.handle(HeartbeatMissed("count-2", 3.0))[0], RestartStage)
    sup.handle(HeartbeatSeen("count-2", 4.0, {"role": "standby", "state": "catching_up"}))
    # The primary fails while the standby is behind: restart the primary, keep the standby.
    assert sup.handle(ProcessExited("count-1", 5.0, -9)) == [
        RestartStage(sup.replicas["count-1"].spec)
    ]
    assert sup.replicas["count-2"].state == "catching_up"
    # The restarted primary finishes a batch, then the standby catches up.
    restarted = {"state": "running", "role": "primary", "batches": 1, "started_at": 5.5}
    sup.handle(HeartbeatSeen("count-1", 6.0, restarted))
    sup.handle(HeartbeatSeen("count-2", 6.0, {"role": "standby", "state": "running"}))
    assert sup.replicas["count-2"].state == "running"
    assert sup.handle(ProcessExited("count-1", 9.0, -9)) == [
        KillReplica("count-1"),
        PromoteStandby("count-2", "count"),
    ]


def test_failed_promotion_restarts_the_primary_from_its_checkpoint():
    sup = Supervisor("j", "wordcount", per_operator("count"), "active-all", NODES)
    sup.start(0.0)
    running(sup)
    sup.handle(ProcessExited("count-1", 10.0, -9))
    actions = sup.handle(HeartbeatSeen("count-2", 11.0, {"state": "promote_failed"}))
    assert actions[0] == KillReplica("count-2")
    assert isinstance(actions[1], RestartStage) and actions[1].replica.replica_id == "count-1"
    assert isinstance(actions[2], StartReplica) and actions[2].replica.role == "standby"


def test_standby_failure_restarts_the_standby():
    sup = Supervisor(
        "j", "wordcount", per_operator("count"), "adaptive", NODES, active_stages={"count"}
    )
    sup.start(0.0)
    running(sup)
    actions = sup.handle(ProcessExited("count-2", 3.0, 1))
    assert actions == [RestartStage(sup.replicas["count-2"].spec)]


def test_adaptive_gives_standbys_only_to_active_stages():
    sup = Supervisor("j", "wordcount", per_operator("split", "count"), "adaptive", NODES, {"count"})
    roles = sorted((a.replica.stage, a.replica.role) for a in sup.start(0.0))
    assert roles == [("count", "primary"), ("count", "standby"), ("split", "primary")]


def test_restart_all_restarts_the_whole_job():
    sup = Supervisor("j", "wordcount", {"job": ("split", "count")}, "restart-all", NODES)
    (start,) = sup.start(0.0)
    argv = start.replica.argv()
    assert argv[argv.index("--operators") + 1] == "split,count"
    assert not start.replica.warm and start.replica.seed_from is None
    running(sup)
    (restart,) = sup.handle(HeartbeatMissed("job-1", 20.0))
    assert isinstance(restart, RestartJob)
    assert [s.replica_id for s in restart.replicas] == ["job-1"]


class FakeLauncher:
    def __init__(self):
        self.calls = []

    def start(self, replica):
        self.calls.append(("start", replica.replica_id))

    def kill(self, replica_id):
        self.calls.append(("kill", replica_id))

    def alive(self, replica_id):
        return True


def test_execute_maps_actions_to_launcher_calls_and_commands():
    sup = Supervisor("j", "wordcount", per_operator("count"), "active-all", NODES)
    launcher, commands = FakeLauncher(), []
    execute(sup.start(0.0), launcher, lambda r, c: commands.append((r, c)))
    running(sup)
    execute(
        sup.handle(ProcessExited("count-1", 1.0)), launcher, lambda r, c: commands.append((r, c))
    )
    assert launcher.calls == [("start", "count-1"), ("start", "count-2"), ("kill", "count-1")]
    assert commands == [("count-2", {"cmd": "promote"})]


def test_policy_can_add_move_and_drop_standbys_and_the_state_survives_a_snapshot():
    sup = Supervisor(
        "j",
        "wordcount",
        per_operator("split", "count"),
        "adaptive",
        NODES,
        placement={"split": ("node-3", None), "count": ("node-1", None)},
    )
    nodes = {a.replica.replica_id: a.replica.node for a in sup.start(0.0)}
    assert nodes == {"split-1": "node-3", "count-1": "node-1"}
    running(sup)
    assert sup.all_running()
    (start,) = sup.add_standby("count", "node-2", 5.0)
    assert (start.replica.role, start.replica.node) == ("standby", "node-2")
    assert sup.has_standby("count") and sup.add_standby("count", "node-3", 5.0) == []
    assert sup.placement_by_stage() == {"split": ("node-3", None), "count": ("node-1", "node-2")}
    restored = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    assert restored.placement_by_stage() == sup.placement_by_stage()
    assert restored.active_stages == {"count"}
    assert restored.drop_standby("count") == [KillReplica("count-2")]
    assert not restored.has_standby("count")
    # Without a standby, a primary failure falls back to a restart from the checkpoint.
    running(restored)
    assert isinstance(restored.handle(ProcessExited("count-1", 9.0))[0], RestartStage)


def test_stage_args_resume_the_replica_checkpoint():
    from spark_runtime.runner import stage_args

    sup = Supervisor("j", "wordcount", per_operator("count"), "local-restart", NODES)
    (start,) = sup.start(0.0)
    args = stage_args(start.replica, "redis://h:1/2", "/ck", trigger_seconds=2)
    assert args[args.index("--checkpoint-dir") + 1] == "/ck/j/count/count-1"
    assert args[args.index("--trigger-seconds") + 1] == "2"
    assert args[args.index("--replica-id") + 1] == "count-1"


def test_a_new_standby_after_a_promotion_is_seeded_from_the_new_primary_and_timed():
    sup = Supervisor("j", "wordcount", {"count": ("split", "count")}, "adaptive", NODES, {"count"})
    first = {a.replica.replica_id: a.replica for a in sup.start(0.0)}
    # At launch nothing is committed yet: the first standby starts empty, at a low priority.
    assert first["count-2"].seed_from is None and first["count-2"].low_priority
    assert not first["count-1"].low_priority
    running(sup)
    sup.handle(ProcessExited("count-1", 10.0, -9))
    (start,) = sup.handle(HeartbeatSeen("count-2", 11.0, {"role": "primary", "state": "running"}))
    new = start.replica
    assert (new.replica_id, new.role, new.seed_from) == ("count-3", "standby", "count-2")
    assert new.warm and new.low_priority
    assert new.node != first["count-2"].node  # not beside its new primary
    # The promoted replica runs at the normal priority and is not re-seeded on a restart.
    promoted = sup.replicas["count-2"].spec
    assert (promoted.role, promoted.seed_from, promoted.low_priority) == ("primary", None, False)
    # Protected again once the new standby reports running (caught up): 10 s -> 18.5 s.
    sup.handle(HeartbeatSeen("count-3", 14.0, {"role": "standby", "state": "catching_up"}))
    assert sup.reprotections == []
    sup.handle(HeartbeatSeen("count-3", 18.5, {"role": "standby", "state": "running"}))
    assert sup.reprotections == [("count", 10.0, 18.5)]
    restored = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    assert restored.reprotections == [("count", 10.0, 18.5)]
    assert restored.replicas["count-3"].spec == new


def test_strategies_differ_only_through_the_strategy_table():
    from spark_runtime.strategies import STRATEGY_TABLE

    for name, definition in STRATEGY_TABLE.items():
        sup = Supervisor("j", "wordcount", {"count": ("split", "count")}, name, NODES, {"count"})
        specs = [a.replica for a in sup.start(0.0)]
        standbys = [s for s in specs if s.role == "standby"]
        assert bool(standbys) == (definition.standbys != "none"), name
        assert all(s.warm == definition.warm_spares for s in specs), name
        assert all(s.low_priority == definition.low_priority_standbys for s in standbys), name


def _catching_up_standby_and_failed_primary():
    """count-1 primary and count-2 standby catching up (started 0 s); count-1 dies at 10 s and
    is restarted from its checkpoint."""
    sup = Supervisor("j", "wordcount", per_operator("count"), "active-all", NODES)
    sup.start(0.0)
    sup.handle(HeartbeatSeen("count-1", 1.0, {"state": "running", "role": "primary"}))
    sup.handle(HeartbeatSeen("count-2", 1.0, {"state": "catching_up", "role": "standby"}))
    actions = sup.handle(ProcessExited("count-1", 10.0, -9))
    assert actions == [RestartStage(sup.replicas["count-1"].spec)]
    return sup


def test_a_standby_that_catches_up_before_the_restarted_primary_produces_takes_over():
    sup = _catching_up_standby_and_failed_primary()
    # The failed process's last entry (batches done, started before the restart) proves nothing.
    old = {"state": "running", "role": "primary", "batches": 40, "started_at": 0.5}
    assert sup.handle(HeartbeatSeen("count-1", 11.0, old)) == []
    # The restarted process is up but has not finished a batch (it is loading its state).
    new = {"state": "running", "role": "primary", "batches": 0, "started_at": 12.0}
    assert sup.handle(HeartbeatSeen("count-1", 14.0, new)) == []
    actions = sup.handle(HeartbeatSeen("count-2", 15.0, {"state": "running", "role": "standby"}))
    assert actions == [KillReplica("count-1"), PromoteStandby("count-2", "count")]
    assert "into the primary's restart" in sup.history[-1][1]
    # The promotion completes as any other: a new standby, seeded from count-2.
    (start,) = sup.handle(HeartbeatSeen("count-2", 16.0, {"state": "running", "role": "primary"}))
    assert start.replica.replica_id == "count-3" and start.replica.seed_from == "count-2"
    assert "count-1" not in sup.replicas
    assert Supervisor.from_dict(json.loads(json.dumps(sup.to_dict()))).restarting == {}


def test_a_restarted_primary_that_produces_first_keeps_the_stage():
    sup = _catching_up_standby_and_failed_primary()
    assert Supervisor.from_dict(json.loads(json.dumps(sup.to_dict()))).restarting == {"count": 10.0}
    new = {"state": "running", "role": "primary", "batches": 1, "started_at": 12.0}
    assert sup.handle(HeartbeatSeen("count-1", 14.0, new)) == []
    assert sup.restarting == {}
    # The standby catching up later only means the stage is protected again.
    assert sup.handle(HeartbeatSeen("count-2", 15.0, {"state": "running", "role": "standby"})) == []
    assert sup.replicas["count-1"].role == "primary" and sup.replicas["count-2"].role == "standby"
