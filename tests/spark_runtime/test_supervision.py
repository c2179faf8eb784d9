"""The supervision state machine, driven with synthetic events (no processes, no Redis)."""

from __future__ import annotations

import json
import uuid

from spark_runtime.replicas import (
    JOB,
    STANDBY_PROTECTION,
    GiveUp,
    HeartbeatMissed,
    HeartbeatSeen,
    KillReplica,
    ProcessExited,
    PromoteStandby,
    RestartJob,
    RestartStage,
    ScheduleRestart,
    StartReplica,
)
from spark_runtime.supervision import RestartPolicy, Supervisor, execute

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


def test_a_new_standby_after_a_promotion_goes_to_the_first_preferred_node_besides_its_primary():
    sup = Supervisor("j", "wordcount", per_operator("split", "count"), "active-all", NODES)
    specs = {a.replica.replica_id: a.replica for a in sup.start(0.0)}
    running(sup)
    new_primary = specs["count-2"].node
    # The driver's preference: the new primary's node first (it must be skipped), then the
    # node the round robin would not pick.
    others = [n for n in NODES if n != new_primary]
    round_robin = sup._node_for(sup.stages.index("count") + 1, new_primary)
    wanted = next(n for n in others if n != round_robin)
    sup.standby_nodes = [new_primary, wanted, round_robin]
    sup.handle(ProcessExited("count-1", 10.0, -9))
    (start,) = sup.handle(HeartbeatSeen("count-2", 11.0, {"role": "primary", "state": "running"}))
    assert (start.replica.replica_id, start.replica.node) == ("count-3", wanted)
    # A second standby started before the driver refreshes the list goes elsewhere.
    assert sup.standby_nodes == [new_primary, round_robin, wanted]


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
    assert "--light-input-wait-s" not in args  # 0: the stage's default, never held
    held = stage_args(start.replica, "redis://h:1/2", "/ck", 2, light_input_wait_s=1.5)
    assert held[held.index("--light-input-wait-s") + 1] == "1.5"
    from spark_runtime.stage import build_parser

    assert build_parser().parse_args(held).light_input_wait_s == 1.5


def test_a_new_standby_after_a_promotion_is_seeded_from_the_new_primary_and_timed():
    sup = Supervisor("j", "wordcount", {"count": ("split", "count")}, "adaptive", NODES, {"count"})
    first = {a.replica.replica_id: a.replica for a in sup.start(0.0)}
    # At launch nothing is committed yet: the first standby starts empty, at a low priority.
    assert first["count-2"].seed_from is None and first["count-2"].cpu_priorities
    assert first["count-1"].cpu_priorities  # a primary's priority is the strategy's too
    running(sup)
    sup.handle(ProcessExited("count-1", 10.0, -9))
    (start,) = sup.handle(HeartbeatSeen("count-2", 11.0, {"role": "primary", "state": "running"}))
    new = start.replica
    assert (new.replica_id, new.role, new.seed_from) == ("count-3", "standby", "count-2")
    assert new.warm and new.cpu_priorities
    assert new.node != first["count-2"].node  # not beside its new primary
    # The promoted replica keeps the strategy's priorities (now a primary's) and is not
    # re-seeded on a restart.
    promoted = sup.replicas["count-2"].spec
    assert (promoted.role, promoted.seed_from, promoted.cpu_priorities) == ("primary", None, True)
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
        assert all(s.cpu_priorities == definition.cpu_priorities for s in specs), name
        assert all(s.recovery_first == definition.recovery_first for s in specs), name
        assert ("--recovery-first" in specs[0].argv()) == definition.recovery_first, name


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


# --- restart policy: backoff and give-up ------------------------------------------------------


def producing(sup, replica_id, at, started_at):
    """A heartbeat of a process started at `started_at` that has finished a batch."""
    entry = {"state": "running", "role": sup.replicas[replica_id].role, "batches": 1}
    sup.handle(HeartbeatSeen(replica_id, at, {**entry, "started_at": started_at}))


def test_the_killed_processs_last_heartbeat_does_not_make_its_restart_running():
    """Found in the live supervision test: the standby was restarted (after a 2 s backoff)
    while its killed process's heartbeat (3 s TTL) was still in Redis. That heartbeat marked
    the new process running, and its start-up silence 0.3 s later was taken for a failure:
    the restart was killed and the stage backed off again."""
    sup = Supervisor("j", "wordcount", per_operator("count"), "adaptive", NODES, {"count"})
    sup.start(0.0)
    producing(sup, "count-1", 5.0, started_at=0.5)
    producing(sup, "count-2", 5.0, started_at=0.5)
    assert sup.replicas["count-2"].state == "running"
    sup.handle(ProcessExited("count-2", 10.0, -9))  # the fault: restarted at once
    assert sup.replicas["count-2"].state == "starting"
    last_beat = {"state": "running", "role": "standby", "batches": 3, "started_at": 0.5}
    assert sup.handle(HeartbeatSeen("count-2", 10.2, last_beat)) == []
    assert sup.replicas["count-2"].state == "starting"
    assert sup.handle(HeartbeatMissed("count-2", 10.5)) == []  # within its startup grace
    # The new process's own heartbeat counts.
    new_beat = {"state": "running", "role": "standby", "batches": 1, "started_at": 25.0}
    assert sup.handle(HeartbeatSeen("count-2", 30.0, new_beat)) == []
    assert sup.replicas["count-2"].state == "running" and sup.replicas["count-2"].healthy


def test_a_replica_failing_before_its_first_batch_backs_off_exponentially_up_to_the_cap():
    policy = RestartPolicy(initial_delay_s=2, max_delay_s=5, max_failures=100)
    sup = Supervisor("j", "wordcount", per_operator("count"), "local-restart", NODES,
                     restart_policy=policy)  # fmt: skip
    sup.start(0.0)
    running(sup)
    # The first failure restarts at once: it may be a fault during start-up.
    assert sup.handle(ProcessExited("count-1", 10.0, 1)) == [
        RestartStage(sup.replicas["count-1"].spec)
    ]
    # Failing again before any batch: wait 2 s, then 4 s, then the 5 s cap.
    expected_delays = [2, 4, 5, 5]
    now = 10.0
    for delay in expected_delays:
        now += 1.0
        running(sup, at=now)
        assert sup.handle(ProcessExited("count-1", now, 1)) == [
            ScheduleRestart("count-1", "count", now + delay, delay)
        ]
        assert sup.replicas["count-1"].state == "backoff"
        assert sup.live() == []  # no process to watch while it waits
        assert sup.handle(ProcessExited("count-1", now + 0.1, 1)) == []  # late news
        assert sup.tick(now + delay - 0.1) == []
        now += delay
        assert sup.tick(now) == [RestartStage(sup.replicas["count-1"].spec)]
        assert sup.replicas["count-1"].state == "starting"
    # Once it finishes a batch, a failure is a fault again: restart at once.
    producing(sup, "count-1", now + 2.0, started_at=now + 0.5)
    assert sup.handle(ProcessExited("count-1", now + 5.0, -9)) == [
        RestartStage(sup.replicas["count-1"].spec)
    ]


def test_a_batch_reported_by_the_process_before_the_restart_does_not_count_as_healthy():
    sup = Supervisor("j", "wordcount", per_operator("count"), "local-restart", NODES)
    sup.start(0.0)
    producing(sup, "count-1", 1.0, started_at=0.2)
    sup.handle(ProcessExited("count-1", 10.0, -9))  # a fault: restarted at once
    # The replicas hash still holds the old process's entry (started at 0.2) until the new
    # process overwrites it: that old batch says nothing about the new process.
    producing(sup, "count-1", 11.0, started_at=0.2)
    (action,) = sup.handle(ProcessExited("count-1", 12.0, 1))
    assert action == ScheduleRestart("count-1", "count", 14.0, 2.0)


def test_a_crash_looping_primary_fails_the_job_and_relaunch_resumes_its_checkpoints():
    policy = RestartPolicy(initial_delay_s=1, max_failures=3, failure_window_s=60)
    sup = Supervisor("j", "wordcount", per_operator("split", "count"), "adaptive", NODES,
                     active_stages={"count"}, restart_policy=policy)  # fmt: skip
    sup.start(0.0)
    running(sup)
    sup.handle(ProcessExited("split-1", 10.0, 1))
    sup.handle(ProcessExited("split-1", 11.0, 1))
    assert sup.tick(12.0) == [RestartStage(sup.replicas["split-1"].spec)]
    actions = sup.handle(ProcessExited("split-1", 13.0, 1))
    assert actions[-1] == GiveUp("split", JOB, actions[-1].reason)
    assert "split: 3 primary failures within 60 s (last: split-1" in actions[-1].reason
    # Every replica is made sure to be gone; nothing is left to watch or restart.
    assert sorted(a.replica_id for a in actions[:-1]) == ["count-1", "count-2", "split-1"]
    assert sup.gave_up == actions[-1].reason
    assert sup.live() == [] and sup.tick(1000.0) == []
    # The snapshot keeps the verdict; a relaunch resumes each stage's primary checkpoint.
    sup = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    assert sup.gave_up and sup.restart_policy == policy
    actions = sup.relaunch(2000.0)
    started = [(a.replica.replica_id, a.replica.role) for a in actions]
    assert started == [("split-1", "primary"), ("count-1", "primary"), ("count-3", "standby")]
    assert sup.gave_up is None and sup.failures == {}
    # The failure count starts again: one failure restarts at once.
    running(sup, at=2001.0)
    assert sup.handle(ProcessExited("split-1", 2002.0, 1)) == [
        RestartStage(sup.replicas["split-1"].spec)
    ]


def test_failures_older_than_the_window_do_not_count_towards_giving_up():
    policy = RestartPolicy(max_failures=3, failure_window_s=60)
    sup = Supervisor("j", "wordcount", per_operator("count"), "local-restart", NODES,
                     restart_policy=policy)  # fmt: skip
    sup.start(0.0)
    for at in (10.0, 50.0, 100.0, 140.0):  # never three within 60 s
        producing(sup, "count-1", at - 5.0, started_at=at - 6.0)
        assert isinstance(sup.handle(ProcessExited("count-1", at, -9))[0], RestartStage)
    producing(sup, "count-1", 145.0, started_at=144.0)
    assert isinstance(sup.handle(ProcessExited("count-1", 150.0, -9))[-1], GiveUp)


def test_a_crash_looping_standby_leaves_the_stage_unprotected_not_the_job_failed():
    policy = RestartPolicy(initial_delay_s=1, max_failures=2, failure_window_s=60)
    sup = Supervisor("j", "wordcount", per_operator("count"), "adaptive", NODES,
                     active_stages={"count"}, restart_policy=policy)  # fmt: skip
    sup.start(0.0)
    running(sup)
    assert sup.handle(ProcessExited("count-2", 5.0, 1)) == [
        RestartStage(sup.replicas["count-2"].spec)
    ]
    actions = sup.handle(ProcessExited("count-2", 6.0, 1))
    assert actions[0] == KillReplica("count-2")
    assert actions[-1].scope == STANDBY_PROTECTION and actions[-1].stage == "count"
    assert sup.gave_up is None and "count-2" not in sup.replicas
    # The policy cannot bring the standby back; the primary keeps serving and restarts alone.
    assert sup.add_standby("count", "node-3", 7.0) == []
    assert sup.handle(ProcessExited("count-1", 8.0, -9)) == [
        RestartStage(sup.replicas["count-1"].spec)
    ]


def test_restart_all_backs_off_the_whole_job_together():
    sup = Supervisor("j", "wordcount", {"job": ("split", "count")}, "restart-all", NODES)
    sup.start(0.0)
    running(sup)
    assert isinstance(sup.handle(ProcessExited("job-1", 5.0, 1))[0], RestartJob)
    running(sup, at=6.0)
    assert sup.handle(ProcessExited("job-1", 7.0, 1)) == [
        ScheduleRestart("job-1", "job", 9.0, 2.0, True)
    ]
    assert sup.tick(8.0) == []
    (restart,) = sup.tick(9.0)
    assert isinstance(restart, RestartJob) and [s.replica_id for s in restart.replicas] == ["job-1"]


def test_execute_kills_a_replica_scheduled_for_restart_and_leaves_give_up_to_the_driver():
    calls = []

    class Recorder:
        def start(self, spec):
            calls.append(("start", spec.replica_id))

        def kill(self, replica_id):
            calls.append(("kill", replica_id))

        def alive(self, replica_id):
            return False

    execute(
        [ScheduleRestart("a-1", "a", 5.0, 2.0), GiveUp("a", JOB, "crash loop")],
        Recorder(),
        lambda *args: calls.append(("cmd", args)),
    )
    assert calls == [("kill", "a-1")]


# --- dead versus slow ---------------------------------------------------------------------


def test_a_silent_but_busy_replica_is_slow_until_the_hung_timeout_and_an_idle_one_is_dead():
    sup = Supervisor("j", "wordcount", per_operator("count"), "active-all", NODES,
                     hung_timeout_s=30)  # fmt: skip
    sup.start(0.0)
    running(sup)
    # Silent but busy (an overloaded machine starves its heartbeat thread): flagged, not killed.
    assert sup.handle(HeartbeatMissed("count-1", 10.0, busy=True)) == []
    assert sup.handle(HeartbeatMissed("count-1", 25.0, busy=True)) == []
    assert sup.slow() == ["count-1"]
    # It answers again: no longer slow, nothing was restarted.
    sup.handle(HeartbeatSeen("count-1", 26.0, {"state": "running", "role": "primary"}))
    assert sup.slow() == []
    # Silent and busy for the whole hung timeout: a failure (the standby takes over).
    sup.handle(HeartbeatMissed("count-1", 30.0, busy=True))
    snapshot = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    assert snapshot.slow() == ["count-1"] and snapshot.hung_timeout_s == 30
    assert snapshot.handle(HeartbeatMissed("count-1", 59.0, busy=True)) == []
    assert snapshot.handle(HeartbeatMissed("count-1", 60.0, busy=True)) == [
        KillReplica("count-1"),
        PromoteStandby("count-2", "count"),
    ]
    assert "hung: busy but silent for 30 s" in " ".join(h for _, h in snapshot.history)

    # A silent replica whose process does no work (hung, or stopped by a signal) is dead now.
    sup = Supervisor("j", "wordcount", per_operator("count"), "local-restart", NODES)
    sup.start(0.0)
    running(sup)
    assert sup.handle(HeartbeatMissed("count-1", 10.0, busy=False)) == [
        RestartStage(sup.replicas["count-1"].spec)
    ]


def test_a_new_standby_that_catches_up_during_a_restart_counts_as_protection_regained():
    sup = Supervisor("j", "wordcount", per_operator("count"), "active-all", NODES)
    sup.start(0.0)
    running(sup)
    sup.handle(ProcessExited("count-1", 10.0, -9))  # promote count-2
    sup.handle(HeartbeatSeen("count-2", 11.0, {"state": "running", "role": "primary"}))
    sup.handle(HeartbeatSeen("count-3", 12.0, {"state": "catching_up", "role": "standby"}))
    sup.handle(ProcessExited("count-2", 20.0, -9))  # count-3 still behind: restart count-2
    actions = sup.handle(HeartbeatSeen("count-3", 25.0, {"state": "running", "role": "standby"}))
    assert actions[-1] == PromoteStandby("count-3", "count")
    # Promotable again at 25 s, 15 s after the promotion was decided (10 s), then promoted at once.
    assert sup.reprotections == [("count", 10.0, 25.0)]


def moving_count_standby():
    """An adaptive job whose count stage has a caught-up standby count-2 on node-2, moved by
    the policy to node-3 (the new standby count-3 is starting)."""
    sup = Supervisor(
        "j", "wordcount", per_operator("count"), "adaptive", NODES, {"count"},
        placement={"count": ("node-1", "node-2")},
    )  # fmt: skip
    sup.start(0.0)
    running(sup)
    (start,) = sup.move_standby("count", "node-3", 5.0)
    assert (start.replica.replica_id, start.replica.node) == ("count-3", "node-3")
    assert start.replica.seed_from == "count-1"  # a copy of the primary's checkpoint
    return sup


def test_a_moved_standby_replaces_the_old_one_only_once_it_is_caught_up():
    sup = moving_count_standby()
    # Until then both run, and the old one is the stage's standby; asking again does nothing.
    assert sup.placement_by_stage() == {"count": ("node-1", "node-2")}
    assert sup.move_standby("count", "node-3", 6.0) == []
    assert sup.handle(HeartbeatSeen("count-3", 8.0, {"state": "catching_up"})) == []
    assert "count-2" in sup.replicas
    # The state survives a controller restart in the middle of the move.
    sup = Supervisor.from_dict(json.loads(json.dumps(sup.to_dict())))
    actions = sup.handle(HeartbeatSeen("count-3", 12.0, {"state": "running", "role": "standby"}))
    assert actions == [KillReplica("count-2")]
    assert sup.placement_by_stage() == {"count": ("node-1", "node-3")}
    assert sup.retiring == {}


def test_a_primary_failure_during_a_move_promotes_the_caught_up_standby_and_keeps_the_new():
    sup = moving_count_standby()
    actions = sup.handle(ProcessExited("count-1", 7.0, -9))
    assert actions == [KillReplica("count-1"), PromoteStandby("count-2", "count")]
    # Promoted: the moving standby is the stage's standby now; no third one is started.
    assert sup.handle(HeartbeatSeen("count-2", 9.0, {"role": "primary", "state": "running"})) == []
    assert sup.placement_by_stage() == {"count": ("node-2", "node-3")}
    # It catches up: nothing is killed, and the stage counts as protected again from then.
    assert sup.handle(HeartbeatSeen("count-3", 15.0, {"state": "running"})) == []
    assert sup.reprotections == [("count", 7.0, 15.0)]
    assert set(sup.replicas) == {"count-2", "count-3"}


def test_dropping_a_stage_in_the_middle_of_a_move_kills_both_standbys():
    sup = moving_count_standby()
    assert sup.drop_standby("count") == [KillReplica("count-2"), KillReplica("count-3")]
    assert sup.retiring == {} and not sup.has_standby("count")


def test_a_machine_saved_before_primaries_took_part_in_cpu_priorities_loads():
    """Supervisor state saved in Redis by an older version has `low_priority` (standbys only)
    and no `recovery_first` in its replica specs: it loads, with the strategy's cpu_priorities
    and recovery class for every replica."""
    sup = Supervisor("j", "wordcount", {"count": ("split", "count")}, "adaptive", NODES, {"count"})
    sup.start(0.0)
    saved = json.loads(json.dumps(sup.to_dict()))
    for item in saved["replicas"]:
        del item["spec"]["cpu_priorities"]
        del item["spec"]["recovery_first"]
        item["spec"]["low_priority"] = item["spec"]["role"] == "standby"
    restored = Supervisor.from_dict(saved)
    assert {r.spec.role for r in restored.replicas.values()} == {"primary", "standby"}
    assert all(r.spec.cpu_priorities for r in restored.replicas.values())
    # Nor had it a recovery class apart from CPU priorities: the strategy's is filled in.
    assert all(r.spec.recovery_first for r in restored.replicas.values())


def test_a_machine_saved_by_a_newer_version_with_fields_unknown_here_loads(caplog):
    """A deploy rolled back after a field was added: the state in Redis has fields this version
    does not know, in the restart policy, the replicas and their specs, the cause streaks and
    at the top. It loads without them (they were a TypeError), and says so once per field."""
    policy = RestartPolicy(initial_delay_s=3.0, max_failures=5)
    sup = Supervisor(
        "j", "wordcount", {"count": ("split", "count")}, "adaptive", NODES, {"count"},
        restart_policy=policy,
    )  # fmt: skip
    sup.start(0.0)
    sup.handle(ProcessExited("count-1", 5.0, 1, cause="boom"))
    expected = sup.to_dict()
    newer = json.loads(json.dumps(expected))
    # Field names of this test's own: each is logged once per process, and another test may
    # have loaded a state with the same names before.
    tag = uuid.uuid4().hex[:8]
    newer["restart_policy"][f"jitter_ratio_{tag}"] = 0.2
    newer["cause_streaks"] = {
        k: {**v, f"first_at_{tag}": 1.0} for k, v in newer["cause_streaks"].items()
    }
    assert newer["cause_streaks"], "a streak to load"
    for item in newer["replicas"]:
        item[f"drained_{tag}"] = False
        item["spec"][f"gpu_{tag}"] = "none"
    newer[f"priority_class_{tag}"] = "gold"
    with caplog.at_level("WARNING", logger="spark_runtime.snapshot"):
        restored = Supervisor.from_dict(newer)
        Supervisor.from_dict(newer)  # a second load says nothing new
    assert restored.to_dict() == expected
    assert restored.restart_policy == policy
    unknown = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert sorted(m.split()[0] for m in unknown) == [
        "CauseStreak", "Replica", "ReplicaSpec", "RestartPolicy",
    ]  # fmt: skip


def test_an_app_restarts_into_a_warm_spare_under_restart_all_and_keeps_it_saved():
    # Backstop's own restart-all job stays the plain Spark baseline: no warm spare.
    plain = Supervisor("j", "wordcount", {"job": ("split", "count")}, "restart-all", NODES)
    assert [a.replica.warm for a in plain.start(0.0)] == [False]
    app = Supervisor("a", "spend@1", {"job": ("app",)}, "restart-all", NODES, app=True)
    [start] = app.start(0.0)
    assert start.replica.warm
    running(app)
    # A controller taking the job over restores the flag with the state it loads.
    app = Supervisor.from_dict(json.loads(json.dumps(app.to_dict())))
    assert app.app and app.takes_warm_spares
    [restart] = app.handle(ProcessExited("job-1", 5.0, -9))
    assert isinstance(restart, RestartJob)
    assert [spec.warm for spec in restart.replicas] == [True]
    # A state saved before the flag existed loads as a job's, not an app's.
    older = {k: v for k, v in plain.to_dict().items() if k != "app"}
    assert not Supervisor.from_dict(older).takes_warm_spares
