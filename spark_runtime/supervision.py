"""The supervision state machine of a job: which replicas should run where, and what to do when
one fails. Pure Python: no I/O, no clock (times come in with the events).

Drivers (the local runner here, the Celery controller later) feed it events and carry out the
actions it returns through a `Launcher` (processes) and a control channel (commands to replicas):

    sup = Supervisor(job, topology, stages, strategy="local-restart", nodes=["node-1", ...])
    execute(sup.start(now), launcher, send_command)
    ... every tick, per live replica:
        ProcessExited / HeartbeatMissed / HeartbeatSeen(reported=<replicas-hash entry>)
    execute(sup.handle(event), launcher, send_command)

Strategies (spark_runtime/strategies.py defines each once):
- `restart-all`: one fused stage; any failure restarts the whole job from its checkpoint.
- `local-restart`: one primary per stage; a failed primary restarts from its own checkpoint.
- `active-all`: every stage has a hot standby on another node; a failed primary is replaced by
  promoting its standby, and a new standby is started, seeded from the new primary's checkpoint.
- `adaptive`: like active-all for the stages in `active_stages` (chosen by the policy), like
  local-restart for the others.

Re-protection: after a promotion the stage has no promotable standby until the new one reports
`running` (caught up with its primary); `reprotections` records each such interval.

What a failure leads to (spark_runtime/failover.py, split as in Flink): the strategy's failover
strategy says which replicas restart or which standby takes over; the restart-backoff strategy
(Flink's exponential-delay strategy with a failure-rate limit, set by a `RestartPolicy`) says
whether and when. A replica that fails after it finished a batch since its launch is restarted
at once (a fault: recovery time matters). One that fails again before it ever finished a batch
is crash-looping: its restart waits (`BACKOFF`, carried out by `tick(now)`), twice as long after
each further such failure, up to a cap. When a stage's primaries fail `max_failures` times within
`failure_window_s`, or `same_cause_failures_limit` times in a row with the same cause (a
deterministic failure: see failover.ExponentialDelayRestartBackoff), the supervisor gives up on
the job (`GiveUp`, the driver marks it failed); when its standbys do, the stage runs unprotected
instead. A failure whose cause is a full disk (failover.waits_for_space) counts toward neither:
the replica is restarted with the backoff until space is back. `relaunch(now)` starts a
given-up job again, each stage from its last primary's checkpoint.

Persistence: `to_dict()` snapshots the fields of `SupervisorState` (supervisor_state.py; the
driver keeps it in Redis between ticks) and `Supervisor.from_dict` rebuilds the machine, also
from an older version's, and from a newer version's: fields this version does not know are left
out (spark_runtime/snapshot.py). The policy's changes to protection (a standby added, moved or
dropped, another strategy) are `StandbyChanges`; failures, promotions and restarts are
`Supervisor`'s own.

Causes: a replica whose query failed writes a one-line cause into its replicas-hash entry
before it exits; the driver reads it (`reported_cause`) into the event (`cause`), and it reaches
the history, the GiveUp reason and the restart-backoff strategy. A replica that reported its own
failure is failed at once, whatever its heartbeat, start-up grace or CPU say.

Dead versus slow: a process exit is a failure at once. A missing heartbeat from a process that
its agent sees alive and using CPU (`HeartbeatMissed(busy=True)`) is "slow": the replica is
flagged (`slow()`) and left alone until it has been silent for `hung_timeout_s`, so an overloaded
machine does not get a cascade of restarts that overload it further. A missing heartbeat from
an idle or stopped process (a hang, a SIGSTOP) is a failure at once.

Racing a restart: when a primary fails while its standby is still catching up, the primary is
restarted from its checkpoint; if the standby catches up before the restarted primary has
finished a batch (a restart costs a driver, a session and a state load), the standby is promoted
then and the restart is abandoned, so the faster of the two serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from spark_runtime import upgrade as upgrades
from spark_runtime.failover import (
    ExponentialDelayRestartBackoff,
    Restart,
    RestartPolicy,
    TakeOver,
    waits_for_space,
)
from spark_runtime.replicas import (
    BACKOFF,
    CATCHING_UP,
    CLOCK_SLACK_S,
    FAILED,
    JOB,
    PRIMARY,
    PROMOTING,
    RUNNING,
    STANDBY,
    STANDBY_PROTECTION,
    STARTING,
    GiveUp,
    HeartbeatMissed,
    HeartbeatSeen,
    KillReplica,
    ProcessExited,
    PromoteStandby,
    Replica,
    ReplicaSpec,
    RestartJob,
    RestartStage,
    ScheduleRestart,
    StartReplica,
    of_an_earlier_run,
    relaunched,
)
from spark_runtime.strategies import get_strategy
from spark_runtime.supervisor_state import SupervisorState
from spark_runtime.upgrade import DemoteReplica, StopApp


class StandbyChanges(SupervisorState):
    """The policy's changes to a job's protection: a standby added, moved or dropped, another
    strategy; and where a standby this machine places itself goes."""

    # Where a standby this machine places itself (after a promotion, at a relaunch, or when the
    # plan named no node) should go, best first; the driver keeps it current (nodes with a warm
    # spare ready, then by Q). Empty: round robin over `nodes`. Set by Supervisor.__init__; not
    # a field of the snapshot (the driver sets it again every cycle).
    standby_nodes: list[str]

    def _standby_for(self, stage: str, primary_node: str, now: float) -> StartReplica:
        preferred = [node for node in self.standby_nodes if node != primary_node]
        if preferred:
            node = preferred[0]
            # The next standby started before the driver refreshes the list (several stages
            # promoted at once after a node loss) goes to the next node, not onto this one.
            self.standby_nodes.remove(node)
            self.standby_nodes.append(node)
        else:
            node = self._node_for(self.stages.index(stage) + 1, primary_node)
        return self._add(self._new_spec(stage, STANDBY, node), now)

    def add_standby(self, stage: str, node: str, now: float) -> list:
        """Give `stage` a hot standby on `node` (the policy's decision); no-op if it has one."""
        allowed = self.failover.promotes and stage not in self.unprotectable
        if self._upgrading(stage):
            return []  # the upgrade's old version protects the stage until it ends
        if stage in self.stages and allowed and not self.has_standby(stage):
            self.active_stages.add(stage)
            self.history.append((now, f"add a standby for {stage} on {node}"))
            return [self._add(self._new_spec(stage, STANDBY, node), now)]
        return []

    def move_standby(self, stage: str, node: str, now: float) -> list:
        """Move `stage`'s standby to `node` (the policy's decision), make before break: the new
        standby starts now (seeded from the primary's checkpoint, as every new standby) and the
        old one is killed only once the new one reports caught up, so the stage stays protected
        throughout. Without a standby this adds one; while a move of the stage is under way (or
        the standby is on `node` already) it does nothing."""
        old = self.standby_of(stage)
        if old is None or self._upgrading(stage):
            return self.add_standby(stage, node, now)
        if stage in self.retiring or old.spec.node == node:
            return []
        self.retiring[stage] = old.id
        self.history.append(
            (now, f"move {stage}'s standby from {old.spec.node} to {node}: {old.id} protects "
             "the stage until the new standby is caught up")
        )  # fmt: skip
        return [self._add(self._new_spec(stage, STANDBY, node), now)]

    def _retire_moved(self, stage: str, caught_up: Replica, now: float) -> list:
        """A standby of `stage` caught up: if it is the target of a move, kill the standby it
        replaces (unless that one was promoted meanwhile; then the new one just stays)."""
        old_id = self.retiring.get(stage)
        if old_id is None or old_id == caught_up.id:
            return []
        del self.retiring[stage]
        old = self.replicas.get(old_id)
        if old is None or old.role != STANDBY or old.state == PROMOTING:
            return []
        del self.replicas[old_id]
        self.history.append((now, f"{caught_up.id} caught up: the moved standby {old_id} goes"))
        return [KillReplica(old_id)]

    def drop_standby(self, stage: str) -> list:
        """Remove `stage`'s standby (the policy's decision): kill it and stop replacing it."""
        self.active_stages.discard(stage)
        self.retiring.pop(stage, None)
        actions = []
        for replica in self.of_stage(stage, STANDBY):
            if replica.state != PROMOTING:
                del self.replicas[replica.id]
                actions.append(KillReplica(replica.id))
        return actions

    def change_strategy(self, strategy: str, now: float) -> list:
        """Protect the job by `strategy` from now on, with the same stages and the same running
        replicas (the caller checked that the strategy cuts the job into these stages:
        `same_stages`). What a failure leads to follows the new strategy at once; stages it
        protects get a standby now, those it does not lose theirs; a strategy whose standbys
        the policy chooses keeps the ones there are (the next policy cycle adds, drops or moves
        them). New replicas start with the new strategy's options (seeded standbys, warm
        spares, CPU priorities); running ones keep theirs until they restart. Idempotent: the
        same strategy again changes nothing."""
        if strategy == self.strategy:
            return []
        new = get_strategy(strategy)
        self.history.append((now, f"strategy {self.strategy} -> {strategy}"))
        self.strategy = strategy
        wanted = new.standby_stages(self.stages, self.active_stages)
        if not new.on_failure.promotes:
            wanted = set()  # a standby nobody promotes only costs resources
        actions = []
        for stage in self.stages:
            if self._upgrading(stage):
                continue  # its upgrade's two versions protect it until the upgrade ends
            if stage not in wanted:
                actions += self.drop_standby(stage)
            elif not self.has_standby(stage):
                self.active_stages.add(stage)
                primaries = self.of_stage(stage, PRIMARY)
                node = primaries[0].spec.node if primaries else self.nodes[0]
                actions.append(self._standby_for(stage, node, now))
        return actions


class Supervisor(StandbyChanges):
    """The state machine. `handle(event)` updates the replica table and returns actions."""

    def __init__(
        self,
        job: str,
        topology: str,
        stages: Mapping[str, Sequence[str]],
        strategy: str,
        nodes: list[str],
        active_stages: set[str] | None = None,
        params: tuple[str, ...] = (),
        startup_grace: float = 90.0,
        placement: dict[str, tuple[str, str | None]] | None = None,
        restart_policy: RestartPolicy | None = None,
        hung_timeout_s: float = 30.0,
        app: bool = False,
    ):
        if not nodes:
            raise ValueError("at least one node is needed")
        super().__init__(
            job=job,
            topology=topology,
            stage_operators={name: tuple(ops) for name, ops in stages.items()},
            strategy=strategy,
            nodes=list(nodes),
            active_stages=get_strategy(strategy).standby_stages(stages, active_stages or ()),
            params=params,
            startup_grace=startup_grace,
            placement=dict(placement or {}),
            restart_policy=restart_policy or RestartPolicy(),
            hung_timeout_s=hung_timeout_s,
            app=app,
        )
        self.standby_nodes = []

    @classmethod
    def from_dict(cls, data: dict) -> Supervisor:
        """Rebuild a machine from `to_dict()` output (also one saved by an earlier version)."""
        sup = cls(data["job"], data["topology"], data["stages"], data["strategy"], data["nodes"])
        sup._load(data)
        return sup

    # -- transitions --------------------------------------------------------------------------

    def start(self, now: float) -> list:
        """The actions that bring the job up: a primary per stage, standbys for active stages."""
        actions = []
        for index, stage in enumerate(self.stages):
            primary_node, standby_node = self.placement.get(stage, (None, None))
            node = primary_node or self._node_for(index)
            primary = self._add(self._new_spec(stage, PRIMARY, node), now)
            actions.append(primary)
            if stage in self.active_stages:
                if standby_node:
                    actions.append(self._add(self._new_spec(stage, STANDBY, standby_node), now))
                else:
                    actions.append(self._standby_for(stage, node, now))
        return actions

    def stop(self) -> list:
        """The actions that take the whole job down."""
        actions = [KillReplica(r.id) for r in self.replicas.values()]
        self.replicas.clear()
        return actions

    def ask_app_to_stop(self, now: float, alive) -> list | None:
        """An app's stop, queries first (each ends on what it has committed), then the process.
        The first call asks the app's running primaries to stop their queries and exit
        (StopApp) and returns that; later calls return [] while one of them still runs
        (`alive(replica_id)`), up to APP_STOP_WITHIN_S after the ask. None once there is
        nothing (more) to wait for: the caller takes the job down with `stop()`, which kills
        whatever still runs. Backstop's own jobs are never asked: their sinks are fenced and
        idempotent, so a kill loses nothing and stops sooner."""
        if not self.app:
            return None
        if self.stop_asked_at is None:
            primaries = [r for r in self.replicas.values() if r.role == PRIMARY]
            running = [r.id for r in primaries if r.state == RUNNING]
            if not running:
                return None
            self.stop_asked_at = now
            self.history.append((now, f"stop: {', '.join(running)} asked to stop its queries"))
            return [StopApp(replica_id, now, why="the job's stop") for replica_id in running]
        waiting = [r.id for r in self.replicas.values() if r.role == PRIMARY and alive(r.id)]
        if waiting and now - self.stop_asked_at < upgrades.APP_STOP_WITHIN_S:
            return []
        if waiting:
            self.history.append(
                (now, f"stop: {', '.join(waiting)} still ran {upgrades.APP_STOP_WITHIN_S:g} s "
                 "after it was asked to stop: killed")
            )  # fmt: skip
        return None

    def handle(self, event) -> list:
        """Apply one event; returns the actions to carry out (possibly none)."""
        replica = self.replicas.get(event.replica_id)
        if replica is None or replica.state in (FAILED, BACKOFF):
            return []  # late news about a replica already dealt with
        if isinstance(event, HeartbeatSeen):
            return self._on_heartbeat(replica, event)
        if isinstance(event, HeartbeatMissed):
            if event.cause:  # it said it failed: no grace, not slow
                return self._on_failure(replica, event.at, "heartbeat missed", event.cause)
            if replica.state == STARTING and event.at - replica.since < self.startup_grace:
                return []  # a replica has no heartbeat until its interpreter is up
            if event.busy:
                return self._on_silent_but_busy(replica, event.at)
            return self._on_failure(replica, event.at, "heartbeat missed")
        if isinstance(event, ProcessExited):
            reason = f"process exited ({event.code})"
            return self._on_failure(replica, event.at, reason, event.cause)
        raise TypeError(f"unknown event {event!r}")

    def _on_silent_but_busy(self, replica: Replica, now: float) -> list:
        if replica.slow_since is None:
            replica.slow_since = now
            self.history.append(
                (now, f"{replica.id} is slow: no heartbeat, but its process is busy; hung after "
                 f"{self.hung_timeout_s:g} s")
            )  # fmt: skip
        silent_s = now - replica.slow_since
        if silent_s < self.hung_timeout_s:
            return []
        replica.slow_since = None
        return self._on_failure(replica, now, f"hung: busy but silent for {silent_s:.0f} s")

    def tick(self, now: float) -> list:
        """The restarts whose backoff delay is over (call it every round, events or not)."""
        due = [r for r in self.replicas.values() if r.state == BACKOFF and r.retry_at <= now]
        if not due:
            return []
        return self._restart_now(self.failover.after_backoff(self, due), now, "backoff over: ")

    def relaunch(self, now: float) -> list:
        """Start a job given up on again: every stage's newest primary resumes its own
        checkpoint, standbys are started anew, and the failure counts are forgotten."""
        actions: list = []
        for stage in self.stages:
            for standby in self.of_stage(stage, STANDBY):
                del self.replicas[standby.id]
            primaries = sorted(self.of_stage(stage, PRIMARY), key=lambda r: r.launched_at)
            for old in primaries[:-1]:
                del self.replicas[old.id]
            if not primaries:  # not expected (a stage keeps a primary entry); start a fresh one
                node = self._node_for(self.stages.index(stage))
                actions.append(self._add(self._new_spec(stage, PRIMARY, node), now))
                continue
            primary = primaries[-1]
            relaunched(primary, now)
            primary.failures_in_a_row = 0
            actions.append(StartReplica(primary.spec))
        self.failures.clear()
        self.cause_streaks.clear()
        self.unprotectable.clear()
        self.restarting.clear()
        self.retiring.clear()
        self.unprotected_since.clear()
        self.gave_up = None
        for stage in self.stages:
            if stage in self.active_stages:
                node = self.of_stage(stage, PRIMARY)[0].spec.node
                actions.append(self._standby_for(stage, node, now))
        self.history.append((now, "relaunch: every stage from its last primary's checkpoint"))
        return actions

    def _on_heartbeat(self, replica: Replica, event: HeartbeatSeen) -> list:
        reported = event.reported or {}
        stage = replica.spec.stage
        started_at = reported.get("started_at")
        if started_at is not None and of_an_earlier_run(started_at, replica.launched_at):
            # The previous process's last heartbeat, alive for its TTL after the relaunch: no
            # news of the process now starting. Taken as news, it marked that one running, and
            # the silence of its start-up (no startup grace once running) a failure.
            return []
        if replica.slow_since is not None:
            replica.slow_since = None
            self.history.append((event.at, f"{replica.id} answers again"))
        if reported.get("batches") and started_at is not None and not replica.healthy:
            replica.healthy, replica.failures_in_a_row = True, 0
            self._backoff().notify_success(f"{stage}/{replica.role}")
        restarted_at = self.restarting.get(stage)
        if (
            replica.role == PRIMARY
            and restarted_at is not None
            and reported.get("batches")
            and reported.get("started_at", 0) >= restarted_at - CLOCK_SLACK_S
        ):
            del self.restarting[stage]  # the restarted process has finished a batch
        if self.upgrade is not None and self.upgrade.under_way:
            actions = upgrades.on_heartbeat(self, replica, reported, event.at)
            if actions is not None:
                return actions
        if replica.state in (STARTING, CATCHING_UP) and reported.get("state") == RUNNING:
            replica.state = RUNNING
            replica.since = event.at
            if replica.role == STANDBY and stage in self.unprotected_since:
                # Promotable again (even if it is promoted at once, below: that is what its
                # being promotable is for).
                promoted_at = self.unprotected_since.pop(stage)
                self.reprotections.append((stage, promoted_at, event.at))
                self.history.append(
                    (event.at, f"{stage} protected again by {replica.id} "
                     f"({event.at - promoted_at:.1f} s after the promotion)")
                )  # fmt: skip
            if replica.role == STANDBY and stage in self.restarting:
                return self._promote_over_restart(replica, event.at)
            if replica.role == STANDBY:
                return self._retire_moved(stage, replica, event.at)
        elif replica.state in (STARTING, RUNNING) and reported.get("state") == CATCHING_UP:
            replica.state = CATCHING_UP
            replica.since = event.at
        if replica.state == PROMOTING:
            if reported.get("role") == PRIMARY and reported.get("state") == RUNNING:
                return self._on_promoted(replica, event.at)
            if reported.get("state") == "promote_failed":
                return self._on_promotion_failed(replica, event.at)
        return []

    def _backoff(self) -> ExponentialDelayRestartBackoff:
        """The restart-backoff strategy: the policy in force over this machine's failures."""
        return ExponentialDelayRestartBackoff(
            self.restart_policy, self.failures, self.cause_streaks
        )

    def _on_failure(self, replica: Replica, now: float, reason: str, cause: str = "") -> list:
        """The failure handler: the restart-backoff strategy says whether to restart and when,
        the failover strategy which replicas restart or which standby takes over. `reason`: how
        the supervisor saw the failure; `cause`: what the replica reported about it ("" if
        nothing)."""
        stage = replica.spec.stage
        replica.slow_since = None
        if cause:
            reason = f"{reason}: {cause}"
        self.history.append((now, f"{replica.id} ({replica.role} of {stage}) failed: {reason}"))
        first, handled = upgrades.on_failure(self, replica.id, now, reason)
        if handled:
            return first
        return [*first, *self._on_ordinary_failure(replica, now, reason, cause)]

    def _on_ordinary_failure(self, replica: Replica, now: float, reason: str, cause: str) -> list:
        stage = replica.spec.stage
        replica.failures_in_a_row = 1 if replica.healthy else replica.failures_in_a_row + 1
        backoff, scope = self._backoff(), f"{stage}/{replica.role}"
        backoff.notify_failure(scope, now, cause=cause)
        if waits_for_space(cause):
            self.history.append(
                (now, f"{replica.id} waits for disk space: restarted with the backoff until "
                 "space is back, not counted toward giving up")
            )  # fmt: skip
        if not backoff.can_restart(scope):
            streak = backoff.repeated_cause(scope)
            if streak is not None:
                limit = self.restart_policy.same_cause_failures_limit
                why = (
                    f"{stage}: {replica.role} failed {streak.count} times in a row with the same "
                    f"cause: {streak.cause}; not restarting (policy "
                    f"same_cause_failures_limit={limit})"
                )
            else:
                why = (
                    f"{stage}: {len(self.failures[scope])} {replica.role} failures within "
                    f"{self.restart_policy.failure_window_s:g} s (last: {replica.id}, {reason})"
                )
            if replica.role == STANDBY and replica.state != PROMOTING and self.failover.promotes:
                return self._give_up_standby(stage, now, why)
            return self._give_up_job(stage, now, why)
        if replica.state == PROMOTING:  # it died taking over: whatever the strategy, restart
            return self._on_promotion_failed(replica, now)
        decision = self.failover.on_failure(self, replica)
        if isinstance(decision, TakeOver):
            return self._take_over(replica, self.replicas[decision.standby_id], now)
        if decision.standby_may_overtake:
            self.restarting[stage] = now  # a standby still catching up may beat the restart
        delay = backoff.backoff_s(replica.failures_in_a_row)
        if delay > 0:
            return self._schedule_restart(decision, replica, now, delay)
        return self._restart_now(decision, now)

    def _take_over(self, failed: Replica, standby: Replica, now: float) -> list:
        """Promote the caught-up `standby` in place of the `failed` primary."""
        stage = failed.spec.stage
        failed.state = FAILED
        standby.state, standby.since = PROMOTING, now
        self.unprotected_since[stage] = now  # until a new standby is caught up
        self.history.append((now, f"promote {standby.id} for {stage}"))
        return [KillReplica(failed.id), PromoteStandby(standby.id, stage)]

    def _restart_now(self, restart: Restart, now: float, note: str = "") -> list:
        """Restart the replicas of `restart` from their checkpoints; `note` heads the history."""
        replicas = [self.replicas[replica_id] for replica_id in restart.replica_ids]
        for replica in replicas:
            relaunched(replica, now)
        if restart.whole_job:
            self.history.append((now, f"{note}restart job from checkpoints"))
            return [RestartJob(tuple(r.spec for r in replicas))]
        self.history += [(now, f"{note}restart {r.id} from its checkpoint") for r in replicas]
        return [RestartStage(r.spec) for r in replicas]

    def _schedule_restart(
        self, restart: Restart, failed: Replica, now: float, delay: float
    ) -> list:
        """The replicas of `restart` wait out the delay `failed` earned; tick() restarts them."""
        in_a_row = failed.failures_in_a_row
        if restart.whole_job:
            why = f"job in {delay:g} s: {failed.id} failed {in_a_row} times in a row"
        else:
            why = f"{', '.join(restart.replica_ids)} in {delay:g} s: failure {in_a_row} in a row"
        self.history.append((now, f"restart {why} before it finished a batch"))
        actions = []
        for replica_id in restart.replica_ids:
            replica = self.replicas[replica_id]
            replica.state, replica.since, replica.retry_at = BACKOFF, now, now + delay
            stage, whole_job = replica.spec.stage, restart.whole_job
            actions.append(ScheduleRestart(replica_id, stage, now + delay, delay, whole_job))
        return actions

    def _give_up_job(self, stage: str, now: float, why: str) -> list:
        """Stop everything and leave the replicas in the table (FAILED) for `relaunch`."""
        self.gave_up = why
        self.history.append((now, f"give up the job: {why}"))
        upgrades.abandon(self, now, f"the job was given up on: {why}")
        actions: list = []
        for replica in self.replicas.values():
            if replica.state != FAILED:
                actions.append(KillReplica(replica.id))
            replica.state, replica.since, replica.retry_at = FAILED, now, None
        return [*actions, GiveUp(stage, JOB, why)]

    def _give_up_standby(self, stage: str, now: float, why: str) -> list:
        """The stage's standbys keep failing: run the stage unprotected from now on."""
        self.unprotectable.add(stage)
        self.unprotected_since.pop(stage, None)
        self.history.append((now, f"stop protecting {stage}: {why}"))
        return [*self.drop_standby(stage), GiveUp(stage, STANDBY_PROTECTION, why)]

    def _promote_over_restart(self, standby: Replica, now: float) -> list:
        """`standby` caught up while its stage's primary is still restarting: promote it and
        abandon the restart (the restarted process is killed; the promotion fences it anyway)."""
        stage = standby.spec.stage
        restarted_at = self.restarting.pop(stage)
        actions: list = []
        for primary in self.of_stage(stage, PRIMARY):
            primary.state, primary.retry_at = FAILED, None
            actions.append(KillReplica(primary.id))
        standby.state, standby.since = PROMOTING, now
        self.unprotected_since[stage] = now
        self.history.append(
            (now, f"promote {standby.id} for {stage}: caught up {now - restarted_at:.1f} s "
             "into the primary's restart, before it produced output")
        )  # fmt: skip
        return [*actions, PromoteStandby(standby.id, stage)]

    def _on_promoted(self, standby: Replica, now: float) -> list:
        stage = standby.spec.stage
        for old in self.of_stage(stage, PRIMARY):
            if old.state == FAILED:
                del self.replicas[old.id]
        standby.spec = replace(standby.spec, role=PRIMARY, seed_from=None)
        standby.state, standby.since = RUNNING, now
        self.history.append((now, f"{standby.id} is the primary of {stage}"))
        # Promoted during a move: the standby that was moving stays as the stage's standby.
        self.retiring.pop(stage, None)
        if stage not in self.active_stages:
            self.unprotected_since.pop(stage, None)
            return []
        promoted_at = self.unprotected_since.setdefault(stage, now)
        others = [r for r in self.of_stage(stage, STANDBY) if r.state != FAILED]
        if not others:
            return [self._standby_for(stage, standby.spec.node, now)]
        if any(r.state == RUNNING for r in others):
            self.unprotected_since.pop(stage)
            self.reprotections.append((stage, promoted_at, now))
        return []

    def _on_promotion_failed(self, standby: Replica, now: float) -> list:
        stage = standby.spec.stage
        self.history.append((now, f"promotion of {standby.id} failed; restart {stage}"))
        actions: list = [KillReplica(standby.id)]
        del self.replicas[standby.id]
        primary_node = None
        for old in self.of_stage(stage, PRIMARY):
            relaunched(old, now)
            primary_node = old.spec.node
            actions.append(RestartStage(old.spec))
        if stage in self.active_stages:
            actions.append(self._standby_for(stage, primary_node, now))
        return actions


# --- carrying out actions ----------------------------------------------------------------


class Launcher(Protocol):
    """Starts and kills replica processes; the local runner uses subprocesses, the Celery
    controller node agents."""

    def start(self, replica: ReplicaSpec) -> None:
        """Launch the replica's stage process on `replica.node`."""

    def kill(self, replica_id: str) -> None:
        """Kill the replica's process (SIGKILL); a no-op if it is gone."""

    def alive(self, replica_id: str) -> bool:
        """True while the replica's process runs."""

    def busy(self, replica_id: str) -> bool:
        """True while the replica's process is alive and using CPU (asked when its heartbeat is
        missing: slow, not dead)."""


def execute(actions: list, launcher: Launcher, send_command) -> None:
    """Carry out `actions`. `send_command(replica_id, dict)` delivers a control command."""
    for action in actions:
        if isinstance(action, StartReplica):
            launcher.start(action.replica)
        elif isinstance(action, KillReplica):
            launcher.kill(action.replica_id)
        elif isinstance(action, PromoteStandby):
            send_command(action.replica_id, {"cmd": "promote"})
        elif isinstance(action, DemoteReplica):
            send_command(
                action.replica_id,
                {"cmd": "demote", "successor": action.successor, "compare": action.compare},
            )
        elif isinstance(action, StopApp):
            send_command(action.replica_id, {"cmd": "stop", "sent_at": action.sent_at})
        elif isinstance(action, RestartStage):
            launcher.kill(action.replica.replica_id)
            launcher.start(action.replica)
        elif isinstance(action, RestartJob):
            for spec in action.replicas:
                launcher.kill(spec.replica_id)
            for spec in action.replicas:
                launcher.start(spec)
        elif isinstance(action, ScheduleRestart):
            launcher.kill(action.replica_id)  # the restart itself comes from tick() later
        elif isinstance(action, GiveUp):
            pass  # for the driver: it marks the job failed or notes the unprotected stage
        else:
            raise TypeError(f"unknown action {action!r}")
