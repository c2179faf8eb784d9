"""The controller: launches jobs, supervises them, applies the policy every cycle, injects faults
and records recoveries. Celery tasks in workers/controller.py call into here.

Supervision reuses the data plane's state machine (`spark_runtime.supervision.Supervisor`) and
its `observe`/`execute` helpers; this module only supplies a Launcher that works through node
agents (Celery queues `node.<name>`) and keeps the database in step. The Supervisor's state is
saved in Redis after every tick, so a controller that dies and comes back picks up where it was.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from console.models import (
    ControlDecision,
    FaultInjection,
    Job,
    MetricSample,
    Node,
    Operator,
    Policy,
    RecoveryEpisode,
    Replica,
)
from console.policy import actions as policy_actions
from console.policy.checkpoint import (
    STAGE_TRIGGER_S,
    ReplicaInterval,
    interval_rollout,
    stage_interval,
    state_store_confs,
)
from console.policy.placement import CycleInput, StandbyVerdict, run_cycle
from console.policy.priority import ACTIVE, operator_priorities
from console.policy.resources import node_capacities, node_score
from console.policy.spares import spares_wanted, standby_node_preference
from console.services import metrics, prediction, recovery
from console.services.planning import JobPlan, plan_job, rank_nodes
from spark_runtime import keys as data_keys
from spark_runtime.runner import observe, stage_args
from spark_runtime.strategies import get_strategy
from spark_runtime.supervision import (
    FAILED,
    JOB,
    RUNNING,
    STANDBY,
    GiveUp,
    HeartbeatSeen,
    KillReplica,
    PromoteStandby,
    ReplicaSpec,
    RestartJob,
    RestartPolicy,
    RestartStage,
    ScheduleRestart,
    StartReplica,
    Supervisor,
    execute,
)
from spark_runtime.topology import get_topology
from workers import keys as control_keys
from workers.queues import node_queue
from workers.redis_client import redis_client

log = logging.getLogger(__name__)

TICK_S = 0.25
# An agent's activity entry older than this (it publishes every second) does not count.
ACTIVITY_FRESH_S = 5.0
NODE_HISTORY_SAMPLES = 20


def checkpoint_root() -> str:
    """Where stage checkpoints live. Across hosts this must be shared storage (see README)."""
    return str(settings.BACKSTOP_CHECKPOINT_ROOT)


def alive_nodes(client) -> dict[str, dict]:
    """Nodes whose agent heartbeat is fresh, with their newest usage sample."""
    result = {}
    for node in Node.objects.all():
        beat = client.get(control_keys.node_heartbeat(node.name))
        if beat is not None:
            result[node.name] = json.loads(beat)
    return result


def node_history(client, names) -> dict:
    """node -> its recent samples as the policy's NodeSamples, newest first."""
    return {
        name: [
            metrics.node_sample_from_usage(name, usage)
            for usage in metrics.recent_node_usages(client, name, NODE_HISTORY_SAMPLES)
        ]
        for name in names
    }


def decide(job: Job, kind: str, reason: str, **fields) -> ControlDecision:
    """Record a controller decision (shown on the job page) and log it."""
    log.info("job %s: %s %s", job.key, kind, reason)
    return ControlDecision.objects.create(job=job, kind=kind, reason=reason, **fields)


def stage_interval_of(job: Job, stage: str) -> float | None:
    """The checkpoint interval a stage should run with: the shortest of its operators'."""
    return stage_interval(
        Operator.objects.filter(job=job, stage=stage).values_list(
            "checkpoint_interval_s", flat=True
        )
    )


class AgentLauncher:
    """A `Launcher` that starts and kills replicas through the node agents' queues."""

    def __init__(self, job: Job, client, trigger_seconds: dict[str, float] | None = None):
        self.job = job
        self.client = client
        self.trigger_seconds = trigger_seconds or {}

    def start(self, replica: ReplicaSpec) -> None:
        from workers.agent import start_replica

        trigger = self.trigger_seconds.get(replica.stage, STAGE_TRIGGER_S)
        interval = stage_interval_of(self.job, replica.stage)
        args = stage_args(
            replica,
            settings.REDIS_URL,
            checkpoint_root(),
            trigger_seconds=trigger,
            # Started with its stage's interval in force; later changes: roll_out_intervals.
            checkpoint_interval_s=interval,
            spark_conf=state_store_confs(interval, trigger) if interval else None,
        )
        node = Node.objects.get(name=replica.node)
        Replica.objects.update_or_create(
            replica_id=self._db_id(replica.replica_id),
            defaults={
                "job": self.job,
                "stage": replica.stage,
                "node": node,
                "role": replica.role,
                "state": Replica.State.STARTING,
                "ended_at": None,
            },
        )
        # A fresh start clears the record of an earlier exit of the same replica id.
        self.client.hdel(self._exits_key(), replica.replica_id)
        start_replica.apply_async(
            args=("spark_runtime.stage", args, replica.replica_id, self.job.key),
            kwargs={"warm": replica.warm},
            queue=node_queue(replica.node),
        )

    def kill(self, replica_id: str) -> None:
        from workers.agent import kill_replica

        row = Replica.objects.filter(replica_id=self._db_id(replica_id)).first()
        if row is None:
            return
        kill_replica.apply_async(args=(replica_id,), queue=node_queue(row.node.name))
        Replica.objects.filter(pk=row.pk).update(
            state=Replica.State.STOPPED, ended_at=timezone.now()
        )

    def alive(self, replica_id: str) -> bool:
        return not self.client.hexists(self._exits_key(), replica_id)

    def exit_code(self, replica_id: str) -> int | None:
        raw = self.client.hget(self._exits_key(), replica_id)
        return None if raw is None else int(json.loads(raw)["returncode"])

    def busy(self, replica_id: str) -> bool:
        """What the replica's agent last saw (within a few seconds): alive and using CPU."""
        raw = self.client.hget(control_keys.replica_activity(self.job.key), replica_id)
        if raw is None:
            return False
        entry = json.loads(raw)
        return bool(entry["busy"]) and time.time() - entry["at"] < ACTIVITY_FRESH_S

    def _exits_key(self) -> str:
        return control_keys.exits(self.job.key)

    def _db_id(self, replica_id: str) -> str:
        # Replica ids from the state machine are unique within a job; the table spans all jobs.
        return f"{self.job.key}/{replica_id}"


def send_command(client, job: Job, replica_id: str, command: dict) -> None:
    """Push a control command (promote, stop, trigger, fault) to a replica's command list."""
    client.rpush(data_keys.control(job.key, replica_id), json.dumps(command))


def command_sender(client, job: Job):
    """`send_command` bound to a job, in the shape the state machine's `execute` wants."""
    return lambda replica_id, command: send_command(client, job, replica_id, command)


# --- launching ---------------------------------------------------------------------------------


class LaunchError(Exception):
    """The job cannot be placed (no node alive, unknown strategy)."""


def restart_policy_of(config) -> RestartPolicy:
    """The state machine's restart policy from the policy in force (console.policy.config)."""
    return RestartPolicy(
        initial_delay_s=config.restart_initial_delay_s,
        max_delay_s=config.restart_max_delay_s,
        max_failures=config.restart_max_failures,
        failure_window_s=config.restart_failure_window_s,
    )


def launch_job(job: Job) -> JobPlan | None:
    """Plan the job with the policy in force, record the assessment, start its replicas.

    A failed job whose supervision state is kept (the supervisor gave up on it) is relaunched
    instead (no plan): every stage resumes its last
    primary's checkpoint, so the results continue where they stopped.
    """
    client = redis_client()
    config = Policy.current().to_config()
    saved = load_supervisor(client, job)
    if saved is not None and job.status == Job.Status.FAILED:
        relaunch_given_up(job, saved, client, config)
        return None
    nodes = alive_nodes(client)
    topology = get_topology(job.topology)
    try:
        plan = plan_job(topology, job.strategy, node_history(client, nodes), config)
    except ValueError as exc:
        raise LaunchError(str(exc)) from exc
    supervisor = Supervisor(
        job.key,
        job.topology,
        {s.name: s.operators for s in plan.stages},
        job.strategy,
        sorted(nodes),
        active_stages={s.name for s in plan.stages if s.standby_node},
        placement={s.name: (s.primary_node, s.standby_node) for s in plan.stages},
        restart_policy=restart_policy_of(config),
        hung_timeout_s=config.hung_timeout_s,
    )
    # The supervision state is saved before the job turns live: the watchdog supervises every
    # live job, and a window that found no state would fail the job ("supervision state lost").
    # Saved with its replicas already starting, so a controller killed before they are asked to
    # start leaves replicas that never heartbeat, which supervision restarts.
    start_actions = supervisor.start(time.time())
    save_supervisor(client, job, supervisor)
    job.mark_starting(f"placing {len(plan.stages)} stages on {', '.join(sorted(nodes))}")
    _store_assessment(job, plan)
    for stage in plan.stages:
        decide(
            job,
            ControlDecision.Kind.ADD_STANDBY
            if stage.standby_node
            else ControlDecision.Kind.SET_INTERVAL,
            stage.reason,
            stage=stage.name,
            node=stage.standby_node or stage.primary_node,
        )
    execute(start_actions, AgentLauncher(job, client), command_sender(client, job))
    for stage in plan.stages:
        if stage.standby_verdict is not None:
            record_standby_verdict(job, supervisor, stage.name, stage.standby_verdict)
    return plan


def relaunch_given_up(job: Job, supervisor: Supervisor, client, config) -> None:
    """Start a failed job again from its checkpoints. The state is saved before anything is
    started, so a controller killed midway leaves a job whose missing processes the next
    supervision tick sees as exited and restarts."""
    supervisor.restart_policy = restart_policy_of(config)
    supervisor.hung_timeout_s = config.hung_timeout_s
    actions = supervisor.relaunch(time.time())
    save_supervisor(client, job, supervisor)
    job.mark_starting("relaunched from the checkpoints after giving up")
    decide(job, ControlDecision.Kind.RESTART_JOB, "relaunch: " + describe_actions(actions))
    execute(actions, AgentLauncher(job, client), command_sender(client, job))


def _store_assessment(job: Job, plan: JobPlan) -> None:
    stage_of = {op: stage.name for stage in plan.stages for op in stage.operators}
    for priority in plan.priorities:
        Operator.objects.filter(job=job, name=priority.name).update(
            type_score=priority.S,
            resource_score=priority.R,
            dependency_score=priority.L,
            priority=priority.P_eff,
            predicted_fault_rate=priority.fr,
            # No stage of this run has a window of history yet; cycles replace it.
            fault_rate_source="prior (at launch)",
            mode=priority.mode,
            stage=stage_of.get(priority.name, ""),
            checkpoint_interval_s=plan.intervals.get(priority.name, 0.0),
        )


def ensure_generator(job: Job, supervisor: Supervisor, client) -> None:
    """The job's input, reconciled every cycle: a running job whose params ask for generated
    input (`rate` > 0) has its seeded generator running on one node until `count` entries are in.

    Asking again is harmless: the agent leaves a running generator alone, and a new one resumes
    after the entries already in the stream. So a controller that dies between marking the job
    running and starting its input loses nothing: the next cycle starts it. Not asked before the
    job runs, so the first measurements are not a start-up backlog.
    """
    rate = float(job.params.get("rate", 0))
    if rate <= 0 or job.status != Job.Status.RUNNING:
        return
    count = job.params.get("count")
    if count is not None and client.xlen(data_keys.input_stream(job.key)) >= int(count):
        return
    alive = alive_nodes(client)
    node = client.get(control_keys.generator_node(job.key))
    if node not in alive:
        node = supervisor.placement_by_stage()[supervisor.stages[0]][0]
        if node not in alive:
            node = min(alive, default=None)
        if node is None:
            return
        client.set(control_keys.generator_node(job.key), node)
    from workers.agent import start_generator

    start_generator.apply_async(
        args=(job.key, job.topology, rate, int(job.params.get("seed", 0)), count),
        queue=node_queue(node),
        expires=30,
    )


# --- supervising -----------------------------------------------------------------------------


def save_supervisor(client, job: Job, supervisor: Supervisor) -> None:
    client.set(control_keys.controller_state(job.key), json.dumps(supervisor.to_dict()))


def load_supervisor(client, job: Job) -> Supervisor | None:
    raw = client.get(control_keys.controller_state(job.key))
    return None if raw is None else Supervisor.from_dict(json.loads(raw))


@dataclass
class TickReport:
    """What one supervision tick saw and did (for logs and tests)."""

    events: int = 0
    actions: int = 0


def read_agent_exits(client, job: Job) -> None:
    """Copy the job's process exits from the agents' event stream into the job's exits hash,
    and mark the job's faults that an agent refused."""
    from console.services.faults import record_refusal

    cursor_key = control_keys.agent_events_cursor(job.key)
    cursor = client.get(cursor_key) or "0-0"
    entries = client.xrange(control_keys.agent_events(), min=f"({cursor}", count=1000)
    for _, fields in entries:
        if fields.get("job") != job.key:
            continue
        if fields.get("kind") == "exit":
            replica_id = fields["replica_id"]
            client.hset(control_keys.exits(job.key), replica_id, json.dumps(fields))
            client.hset(control_keys.exit_tails(job.key), replica_id, fields["log_tail"])
        elif fields.get("kind") == "refused" and fields.get("fault_id", "").isdigit():
            record_refusal(job, fields["fault_id"], fields.get("detail", ""))
    if entries:
        client.set(cursor_key, entries[-1][0])


def supervise_tick(job: Job, supervisor: Supervisor, client) -> TickReport:
    """One round: observe replicas, let the state machine decide, act, record the decisions."""
    report = TickReport()
    read_agent_exits(client, job)
    launcher = AgentLauncher(job, client)
    now = time.time()
    due = supervisor.tick(now)
    if due:
        report.actions += len(due)
        kind, _ = _describe(due)
        decide(job, kind, "backoff over: " + describe_actions(due))
        execute(due, launcher, command_sender(client, job))
    for event in observe(supervisor, launcher, client, job.key, now):
        actions = supervisor.handle(event)
        if not actions:
            continue
        report.events += 1
        report.actions += len(actions)
        if isinstance(event, HeartbeatSeen) and any(isinstance(a, PromoteStandby) for a in actions):
            record_promotion_over_restart(job, event, actions)
        elif isinstance(event, HeartbeatSeen):
            # Not a failure: a promotion completed and the machine asks for a new standby.
            Replica.objects.filter(replica_id=f"{job.key}/{event.replica_id}").update(
                role=Replica.Role.PRIMARY, state=Replica.State.RUNNING
            )
            decide(
                job,
                ControlDecision.Kind.ADD_STANDBY,
                f"{event.replica_id} took over as primary; " + describe_actions(actions),
                replica_id=event.replica_id,
                stage=event.reported.get("stage", ""),
            )
        else:
            _record_failure(job, client, event, actions)
        execute(actions, launcher, command_sender(client, job))
        waiting = [f"{job.key}/{a.replica_id}" for a in actions if isinstance(a, ScheduleRestart)]
        if waiting:  # shown as waiting out the backoff until tick() restarts them
            Replica.objects.filter(replica_id__in=waiting).update(state=Replica.State.BACKOFF)
        for give_up in (a for a in actions if isinstance(a, GiveUp)):
            _gave_up(job, client, event.replica_id, give_up, actions)
        # Other observations of this round may be stale after an action: look again next tick.
        break
    return report


def exit_status(returncode, event_name: str) -> str:
    """How a replica ended, in words (a negative return code is the signal that killed it)."""
    if returncode is None:
        return "heartbeat missed" if event_name == "HeartbeatMissed" else event_name
    code = int(returncode)
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    meaning = {1: "query failed", 3: "fenced by a newer primary", 4: "promotion impossible"}
    return f"exited with code {code}" + (f" ({meaning[code]})" if code in meaning else "")


def describe_actions(actions: list) -> str:
    """The state machine's actions as a sentence for the decision log."""
    words = []
    for action in actions:
        if isinstance(action, StartReplica):
            spec = action.replica
            words.append(f"start {spec.role} {spec.replica_id} on {spec.node}")
        elif isinstance(action, KillReplica):
            words.append(f"make sure {action.replica_id} is gone")
        elif isinstance(action, PromoteStandby):
            words.append(f"promote standby {action.replica_id} of {action.stage}")
        elif isinstance(action, RestartStage):
            spec = action.replica
            words.append(f"restart {spec.replica_id} on {spec.node} from its checkpoint")
        elif isinstance(action, RestartJob):
            ids = ", ".join(spec.replica_id for spec in action.replicas)
            words.append(f"restart the whole job ({ids}) from its checkpoints")
        elif isinstance(action, ScheduleRestart):
            words.append(
                f"restart {action.replica_id} in {action.delay_s:g} s (backoff: it keeps failing "
                "before it finishes a batch)"
            )
        elif isinstance(action, GiveUp) and action.scope == JOB:
            words.append(f"give up the job: {action.reason}")
        elif isinstance(action, GiveUp):
            words.append(f"run {action.stage} without a standby: {action.reason}")
    return "; ".join(words)


# Log lines of the failed replica kept in a job's failure reason.
FAILURE_TAIL_LINES = 20


def _gave_up(job: Job, client, replica_id: str, give_up: GiveUp, actions: list) -> None:
    """The state machine stopped restarting. Scope JOB: stop the generator, mark the job failed
    with a one-line cause and the failed replica's last log lines, and send the alert. A stage
    left without its standby is only recorded (the job keeps running)."""
    if give_up.scope != JOB:
        decide(job, ControlDecision.Kind.GIVE_UP, describe_actions([give_up]),
               stage=give_up.stage, replica_id=replica_id)  # fmt: skip
        return
    from workers.agent import kill_replica

    for node in Node.objects.all():
        kill_replica.apply_async(args=(generator_id(job),), queue=node_queue(node.name))
    killed = [f"{job.key}/{a.replica_id}" for a in actions if isinstance(a, KillReplica)]
    Replica.objects.filter(replica_id__in=killed).update(
        state=Replica.State.FAILED, ended_at=timezone.now()
    )
    tail = (client.hget(control_keys.exit_tails(job.key), replica_id) or "").splitlines()
    reason = f"gave up: {give_up.reason}"
    if tail:
        reason += f"\n\nlast log lines of {replica_id}:\n" + "\n".join(tail[-FAILURE_TAIL_LINES:])
    decide(job, ControlDecision.Kind.GIVE_UP, reason, stage=give_up.stage, replica_id=replica_id)
    if job.mark_failed(reason):
        alert_failed_job(job)


@transaction.atomic
def _record_failure(job: Job, client, event, actions: list) -> None:
    """A failure and the action taken: a ControlDecision pair and an open RecoveryEpisode,
    written together so nobody sees the decision without its episode."""
    replica_id = event.replica_id
    row = (
        Replica.objects.filter(replica_id=f"{job.key}/{replica_id}").select_related("node").first()
    )
    exit_info = client.hget(control_keys.exits(job.key), replica_id)
    returncode = json.loads(exit_info)["returncode"] if exit_info else None
    tail = (
        exit_status(returncode, type(event).__name__)
        + "\n"
        + (client.hget(control_keys.exit_tails(job.key), replica_id) or "")
    )
    stage = row.stage if row else ""
    node = row.node.name if row else ""
    decide(
        job,
        ControlDecision.Kind.FAILURE,
        f"{replica_id}: " + exit_status(returncode, type(event).__name__),
        stage=stage,
        node=node,
        replica_id=replica_id,
        detail={"error_tail": tail, "event": repr(event)},
    )
    if row is not None:
        Replica.objects.filter(pk=row.pk).update(
            state=Replica.State.FAILED, ended_at=timezone.now()
        )
    action_kind, episode_action = _describe(actions)
    if action_kind == ControlDecision.Kind.GIVE_UP:
        return  # no recovery follows: _gave_up records the verdict
    decide(
        job,
        action_kind,
        describe_actions(actions),
        stage=stage,
        node=node,
        replica_id=replica_id,
    )
    if row is not None and row.role == Replica.Role.STANDBY and episode_action == "restart-stage":
        return  # a lost standby costs no output: nothing to recover from
    fault = (
        FaultInjection.objects.filter(
            job=job,
            outcome=FaultInjection.Outcome.INJECTED,
            injected_at__gte=timezone.now() - timezone.timedelta(seconds=60),
        )
        .order_by("-injected_at")
        .first()
    )
    RecoveryEpisode.objects.create(
        job=job,
        fault=fault,
        strategy=job.strategy,
        stage=stage,
        action=episode_action,
        detected_at=timezone.now(),
        notes=f"{replica_id} on {node}: {type(event).__name__}",
    )


@transaction.atomic
def record_promotion_over_restart(job: Job, event: HeartbeatSeen, actions: list) -> None:
    """A standby caught up while its stage's primary was still restarting and takes over: the
    decision, and the stage's open restart episode now records a promotion."""
    stage = event.reported.get("stage", "")
    decide(
        job,
        ControlDecision.Kind.PROMOTE,
        f"{event.replica_id} caught up before the restarted primary produced output; "
        + describe_actions(actions),
        replica_id=event.replica_id,
        stage=stage,
    )
    episode = (
        job.recoveries.filter(
            stage=stage, action=RecoveryEpisode.Action.RESTART_STAGE, watched_s__isnull=True
        )
        .order_by("-detected_at")
        .first()
    )
    if episode is not None:
        episode.action = RecoveryEpisode.Action.PROMOTE
        episode.notes += f"; restart overtaken by {event.replica_id}, promoted when caught up"
        episode.save(update_fields=["action", "notes"])


def _describe(actions: list) -> tuple[str, str]:
    if any(isinstance(a, GiveUp) and a.scope == JOB for a in actions):
        return ControlDecision.Kind.GIVE_UP, RecoveryEpisode.Action.NONE
    if any(isinstance(a, PromoteStandby) for a in actions):
        return ControlDecision.Kind.PROMOTE, RecoveryEpisode.Action.PROMOTE
    if any(isinstance(a, RestartJob) or getattr(a, "whole_job", False) for a in actions):
        return ControlDecision.Kind.RESTART_JOB, RecoveryEpisode.Action.RESTART_JOB
    if any(isinstance(a, RestartStage | ScheduleRestart) for a in actions):
        return ControlDecision.Kind.RESTART_STAGE, RecoveryEpisode.Action.RESTART_STAGE
    if any(isinstance(a, StartReplica | KillReplica) for a in actions):
        return ControlDecision.Kind.ADD_STANDBY, RecoveryEpisode.Action.NONE
    return ControlDecision.Kind.FAILURE, RecoveryEpisode.Action.NONE


def sync_replicas(job: Job, client, supervisor: Supervisor) -> None:
    """Copy what replicas report about themselves (pid, state, epoch, heartbeat) into the DB; a
    replica the supervisor holds for slow (silent but busy) shows as such."""
    reported = client.hgetall(data_keys.replicas(job.key))
    slow = set(supervisor.slow())
    for replica_id, raw in reported.items():
        info = json.loads(raw)
        alive = client.exists(data_keys.heartbeat(job.key, replica_id))
        if replica_id in slow:
            state = Replica.State.SLOW
        elif not alive:
            state = Replica.State.STARTING
        else:
            state = {
                "running": Replica.State.RUNNING,
                "catching_up": Replica.State.CATCHING_UP,
                "starting": Replica.State.STARTING,
                "stopped": Replica.State.STOPPED,
            }.get(info.get("state"), Replica.State.FAILED)
        Replica.objects.filter(replica_id=f"{job.key}/{replica_id}").exclude(
            state__in=(Replica.State.FAILED, Replica.State.STOPPED)
        ).update(
            pid=info.get("pid"),
            role=info.get("role", Replica.Role.PRIMARY),
            fencing_epoch=info.get("epoch") or 0,
            state=state,
            last_heartbeat=datetime.fromtimestamp(info["updated"], tz=UTC)
            if alive and info.get("updated")
            else None,
            checkpoint_interval_s=info.get("checkpoint_interval_s"),
            interval_since=datetime.fromtimestamp(info["interval_since"], tz=UTC)
            if info.get("interval_since")
            else None,
        )


def update_nodes(client) -> dict[str, dict]:
    """Mark nodes up or down from their agents' heartbeats; store their new usage samples."""
    alive = alive_nodes(client)
    for node in Node.objects.all():
        if node.name in alive:
            node.record_heartbeat()
            metrics.ingest_node_metrics(client, node)
        elif node.state != Node.State.DOWN:
            Node.objects.filter(pk=node.pk).update(state=Node.State.DOWN)
    return alive


def keep_warm_spares(client, config) -> dict[str, int]:
    """Tell each node agent how many warm spares to keep (policy setting, within the reserve)."""
    beats = alive_nodes(client)
    wanted = spares_wanted(
        node_capacities(node_history(client, beats), config),
        {name: int(beat.get("spares", 0)) for name, beat in beats.items()},
        config,
    )
    for name, count in wanted.items():
        client.set(data_keys.spares_wanted(name), count)
    return wanted


def idle_spares(client, nodes: list[str]) -> dict[str, int]:
    """Idle warm spares per node, as the node agents report them now."""
    with client.pipeline(transaction=False) as pipe:
        for node in nodes:
            pipe.hvals(data_keys.spares(node))
        reported = pipe.execute()
    return {
        node: sum(1 for raw in entries if json.loads(raw).get("state") == "idle")
        for node, entries in zip(nodes, reported, strict=True)
    }


def nodes_by_q(client, config) -> list[str]:
    """Alive nodes by Q, best first."""
    return rank_nodes(node_history(client, alive_nodes(client)), config)


def release_unused_spares(client) -> bool:
    """No spares where no live job can use them: when no live job's strategy takes over warm
    spares, every node's target is 0 (the agents stop theirs). Otherwise the targets stay as the
    jobs' cycles set them. Returns whether it released them. Spares hold a JVM each: left running
    under a job that cannot use them they only take memory and CPU (and would load the plain-Spark
    baseline of the benchmark)."""
    live = Job.objects.filter(status__in=Job.LIVE_STATUSES).values_list("strategy", flat=True)
    if any(get_strategy(strategy).warm_spares for strategy in live):
        return False
    for node in Node.objects.values_list("name", flat=True):
        client.set(data_keys.spares_wanted(node), 0)
    return True


def record_reprotections(job: Job, supervisor: Supervisor) -> None:
    """Put each completed re-protection (promotion -> promotable standby again) on the promotion
    episode of that stage. Idempotent: an episode that has its figure keeps it."""
    for stage, promoted_at, protected_at in supervisor.reprotections:
        episode = (
            job.recoveries.filter(
                stage=stage,
                action=RecoveryEpisode.Action.PROMOTE,
                detected_at__lte=datetime.fromtimestamp(promoted_at + 5, tz=UTC),
            )
            .order_by("-detected_at")
            .first()
        )
        if episode is not None and episode.reprotect_s is None:
            episode.reprotect_s = round(protected_at - promoted_at, 2)
            episode.save(update_fields=["reprotect_s"])
            decide(
                job,
                ControlDecision.Kind.ADD_STANDBY,
                f"{stage} has a promotable standby again, {episode.reprotect_s:.1f} s after "
                "the promotion",
                stage=stage,
            )
    supervisor.reprotections.clear()


def policy_cycle(job: Job, supervisor: Supervisor, client) -> list:
    """Algorithm 2 with fresh metrics and the policy in force; apply and record its actions.

    Only the adaptive strategy lets the policy add, drop or move standbys; every strategy gets
    its passive stages' checkpoint intervals adjusted.
    """
    config = Policy.current().to_config()  # re-read every cycle: admin changes apply here
    history = node_history(client, alive_nodes(client))
    if not history:
        return []
    topology = get_topology(job.topology)
    newest = [samples[0] for samples in history.values() if samples]
    operators = {op.name: op for op in job.operators.all()}
    stage_of = {op: name for name, ops in supervisor.stage_operators.items() for op in ops}
    # fr from the newest trained model where it is used, else the prior (with why).
    predicted = prediction.predicted_fault_rates(job, stage_of, config)
    priorities = operator_priorities(
        topology,
        sum(s.cpu_total for s in newest),
        sum(s.mem_total for s in newest),
        config,
        fault_rates={name: fr for name, (fr, _) in predicted.items()},
    )
    now = timezone.now()
    MetricSample.objects.bulk_create(
        MetricSample(
            at=now,
            node=node,
            name="q_score",
            value=round(node_score(history[node.name], config), 4),
        )
        for node in Node.objects.filter(name__in=list(history))
    )
    placement = supervisor.placement_by_stage()
    primaries = {op: placement[stage][0] for op, stage in stage_of.items() if stage in placement}
    standbys = {}
    standby_age_s = {}
    moves_standbys = supervisor.definition.policy_moves_standbys
    for stage, ops in supervisor.stage_operators.items():
        standby = _live_standby(supervisor, stage)
        top = _top_operator(ops, priorities)
        if standby and top:
            standbys[top] = standby.spec.node
            # A standby still starting or being promoted has not settled anywhere: it is kept.
            running = standby.state == RUNNING
            standby_age_s[top] = time.time() - standby.launched_at if running else 0.0
    state = CycleInput(
        priorities=[p for p in priorities if p.name in stage_of],
        primaries=primaries,
        standbys=standbys if moves_standbys else {},
        samples=history,
        alive={name: True for name in history},
        faults=recovery.faults_since(job, seconds=config.cycle_interval_s),
        intervals={
            name: op.checkpoint_interval_s
            for name, op in operators.items()
            if op.checkpoint_interval_s
        },
        standby_age_s=standby_age_s,
    )
    result = run_cycle(state, config)
    actions = result.actions
    if not moves_standbys:
        actions = [a for a in actions if isinstance(a, policy_actions.SetCheckpointInterval)]
    _apply_cycle(job, supervisor, client, actions, stage_of)
    if moves_standbys:
        for stage, ops in supervisor.stage_operators.items():
            verdict = result.verdicts.get(_top_operator(ops, priorities))
            if verdict is not None:
                record_standby_verdict(job, supervisor, stage, verdict)
    roll_out_intervals(job, supervisor, client, config)
    for p in priorities:
        Operator.objects.filter(job=job, name=p.name).update(
            type_score=p.S,
            resource_score=p.R,
            dependency_score=p.L,
            priority=p.P_eff,
            mode=p.mode,
            predicted_fault_rate=p.fr,
            fault_rate_source=predicted.get(p.name, (0, "prior (runs in no stage)"))[1],
            updated_at=now,  # update() skips auto_now
        )
        MetricSample.objects.bulk_create(
            MetricSample(at=now, job=job, stage=p.name, name=name, value=round(value, 4))
            for name, value in (
                ("priority", p.P_eff),
                ("type_score", p.S),
                ("resource_score", p.R),
                ("dependency_score", p.L),
                ("predicted_fault_rate", p.fr),
                ("checkpoint_interval_s", operators[p.name].checkpoint_interval_s),
            )
        )
    return actions


def roll_out_intervals(job: Job, supervisor: Supervisor, client, config) -> list:
    """Bring each stage's checkpoint interval (the policy's, stored on its operators) to its
    running replicas, one replica of a stage at a time (checkpoint.interval_rollout has the
    rules), and record when each took effect. Idempotent: a request is kept in Redis until the
    replica reports the interval, and each report is recorded once."""
    requests_key = control_keys.interval_requests(job.key)
    reported = {
        rid: json.loads(raw) for rid, raw in client.hgetall(data_keys.replicas(job.key)).items()
    }
    pending = {rid: json.loads(raw) for rid, raw in client.hgetall(requests_key).items()}
    for replica_id, request in list(pending.items()):
        info = reported.get(replica_id, {})
        if (
            info.get("checkpoint_interval_s") == request["seconds"]
            and info.get("interval_since", 0) >= request["sent_at"]
        ):
            client.hdel(requests_key, replica_id)
            since = datetime.fromtimestamp(info["interval_since"], tz=UTC)
            decide(
                job,
                ControlDecision.Kind.SET_INTERVAL,
                f"{replica_id}: checkpoint interval {request['seconds']:g} s in effect since "
                f"{since:%H:%M:%S}",
                stage=info.get("stage", ""),
                replica_id=replica_id,
                detail={"confs": info.get("confs", {}), "in_effect_at": info["interval_since"]},
            )
            del pending[replica_id]
    wanted = {}
    for stage in supervisor.stage_operators:
        interval = stage_interval_of(job, stage)
        if interval:
            wanted[stage] = interval
    live = []
    for replica in supervisor.live():
        info = reported.get(replica.id, {})
        live.append(
            ReplicaInterval(
                replica_id=replica.id,
                stage=replica.spec.stage,
                role=replica.role,
                running=info.get("state") == "running" and replica.state == "running",
                seconds=info.get("checkpoint_interval_s"),
                since=info.get("interval_since"),
                pending_since=pending.get(replica.id, {}).get("sent_at"),
            )
        )
    gap_start = timezone.now() - timezone.timedelta(seconds=config.interval_apply_gap_s)
    quiet = not (
        job.recoveries.filter(watched_s__isnull=True).exists()
        or job.decisions.filter(kind=ControlDecision.Kind.FAILURE, at__gte=gap_start).exists()
    )
    now = time.time()
    rollout = interval_rollout(wanted, live, now, config.interval_apply_gap_s, quiet)
    for apply in rollout:
        confs = state_store_confs(apply.seconds)
        client.hset(
            requests_key, apply.replica_id, json.dumps({"seconds": apply.seconds, "sent_at": now})
        )
        send_command(
            client,
            job,
            apply.replica_id,
            {"cmd": "checkpoint_interval", "seconds": apply.seconds, "confs": confs},
        )
        decide(
            job,
            ControlDecision.Kind.SET_INTERVAL,
            apply.reason,
            stage=apply.stage,
            replica_id=apply.replica_id,
            detail={"confs": confs},
        )
    return rollout


def _live_standby(supervisor: Supervisor, stage: str):
    """The stage's standby replica, the one placement_by_stage reports (None: it has none)."""
    return next((r for r in supervisor.of_stage(stage, STANDBY) if r.state != FAILED), None)


def record_standby_verdict(
    job: Job, supervisor: Supervisor, stage: str, verdict: StandbyVerdict
) -> None:
    """Store why the stage's standby sits where it is on its replica row, for the placement page.
    Only a standby on the verdict's node gets it; writing it again only renews its time."""
    standby = _live_standby(supervisor, stage)
    if standby is not None and standby.spec.node == verdict.node:
        Replica.objects.filter(replica_id=f"{job.key}/{standby.id}").update(
            placement={**verdict.to_dict(), "at": timezone.now().isoformat()}
        )


def _top_operator(names, priorities) -> str | None:
    """The stage's standby is attributed to its highest-priority active operator."""
    active = [p for p in priorities if p.name in names and p.mode == ACTIVE]
    return max(active, key=lambda p: (p.P_eff, p.name)).name if active else None


def _apply_cycle(job, supervisor, client, actions, stage_of) -> None:
    """Carry out Algorithm 2's actions through the state machine and record each with its reason.

    Standby changes start or kill replicas; an interval change is stored on the operator with the
    Spark settings it maps to (see console/policy/checkpoint.py), and roll_out_intervals brings
    it to the stage's running replicas.
    """
    now = time.time()
    for action in actions:
        stage = stage_of.get(action.operator, "")
        if isinstance(action, policy_actions.SetCheckpointInterval):
            op = Operator.objects.filter(job=job, name=action.operator).first()
            if op is None or abs(op.checkpoint_interval_s - action.seconds) < 0.5:
                continue
            Operator.objects.filter(pk=op.pk).update(checkpoint_interval_s=action.seconds)
            kind, node, steps = ControlDecision.Kind.SET_INTERVAL, "", []
            detail = state_store_confs(action.seconds)
        elif isinstance(action, policy_actions.AddStandby):
            if supervisor.has_standby(stage):
                continue
            kind, node, detail = ControlDecision.Kind.ADD_STANDBY, action.node, {}
            steps = supervisor.add_standby(stage, action.node, now)
        elif isinstance(action, policy_actions.DropStandby):
            kind, node, detail = ControlDecision.Kind.DROP_STANDBY, action.node, {}
            steps = supervisor.drop_standby(stage)
        elif isinstance(action, policy_actions.MoveStandby):
            kind, node, detail = ControlDecision.Kind.MOVE_STANDBY, action.to_node, {}
            steps = supervisor.drop_standby(stage) + supervisor.add_standby(stage, node, now)
        else:
            raise TypeError(f"unknown policy action {action!r}")
        execute(steps, AgentLauncher(job, client), command_sender(client, job))
        decide(
            job, kind, action.reason, operator=action.operator, stage=stage, node=node,
            detail=detail,
        )  # fmt: skip


def alert_slow_recoveries(job: Job) -> None:
    """Ask for recovery-time alerts on the job's recent episodes (each is emailed at most once
    per subscription, so asking every cycle is safe; an open episode alerts while it lasts)."""
    from console.models import ReportSubscription
    from workers.reporting import alert_recovery

    wanted = ReportSubscription.objects.filter(enabled=True, alert_recovery_over_s__isnull=False)
    if not wanted.exists():
        return
    since = timezone.now() - timezone.timedelta(minutes=15)
    for episode_id in job.recoveries.filter(detected_at__gte=since).values_list("pk", flat=True):
        alert_recovery.delay(episode_id)


def alert_failed_job(job: Job) -> None:
    """Email the subscriptions that asked to hear about jobs failing for good."""
    from workers.reporting import alert_job_failed

    alert_job_failed.delay(job.pk)


def stop_everything(job: Job, supervisor: Supervisor, client) -> None:
    """Kill the job's replicas and its generator; the sinks are idempotent, checkpoints stay."""
    from workers.agent import kill_replica

    launcher = AgentLauncher(job, client)
    execute(supervisor.stop(), launcher, command_sender(client, job))
    for node in Node.objects.all():
        kill_replica.apply_async(args=(generator_id(job),), queue=node_queue(node.name))
    Replica.objects.filter(job=job).exclude(
        state__in=(Replica.State.STOPPED, Replica.State.FAILED)
    ).update(state=Replica.State.STOPPED, ended_at=timezone.now())
    client.delete(control_keys.controller_state(job.key))


def record_cycle(client, job: Job, duration_s: float) -> None:
    """When the job's last policy cycle ended and how long it took (read by /metrics)."""
    cycle = {"at": time.time(), "duration_s": round(duration_s, 4)}
    client.set(control_keys.controller_cycle(job.key), json.dumps(cycle), ex=3600)


def close_measurements(job: Job, client) -> None:
    """A job that is no longer live is watched no further: its open recovery episodes get
    their final figures ("not back to normal before ..." when the output never came back)."""
    recovery.measure_open_episodes(job, client, Policy.current().to_config())


def close_episodes_of_ended_jobs(client) -> int:
    """Close the open episodes of jobs that are no longer live, however they ended (a failed
    launch, lost supervision state, an interrupted benchmark); returns how many jobs had some."""
    ended = (
        Job.objects.exclude(status__in=Job.LIVE_STATUSES)
        .filter(recoveries__watched_s__isnull=True)
        .distinct()
    )
    jobs = list(ended)
    for job in jobs:
        close_measurements(job, client)
    return len(jobs)


def generator_id(job: Job) -> str:
    return f"generator-{job.key}"


def supervise_window(job: Job, client, window_s: float, keep_lease) -> bool:
    """Tick the job's supervision for `window_s`; returns whether the job is still live.

    Every tick (TICK_S) handles failures; every policy cycle (cycle_interval_s) also syncs
    replica rows, stores metrics, runs Algorithm 2 and measures open recovery episodes.
    """
    supervisor = load_supervisor(client, job)
    if supervisor is None:
        if job.is_live:
            job.mark_failed("supervision state lost: relaunch the job")
            alert_failed_job(job)
        return False
    deadline = time.monotonic() + window_s
    next_cycle = 0.0
    # Alive nodes by Q, refreshed every policy cycle.
    ranked = nodes_by_q(client, Policy.current().to_config()) or supervisor.nodes
    while time.monotonic() < deadline:
        keep_lease()
        job.refresh_from_db(fields=["status"])
        if job.status == Job.Status.STOPPING:
            stop_everything(job, supervisor, client)
            job.mark_stopped(job.status_reason or "stopped")
            close_measurements(job, client)
            return False
        if not job.is_live:
            close_measurements(job, client)
            return False
        # A standby the supervisor starts on its own (after a promotion) goes where a warm
        # spare is ready, else to the best node by Q: read now, spares come and go in seconds.
        supervisor.standby_nodes = standby_node_preference(ranked, idle_spares(client, ranked))
        supervise_tick(job, supervisor, client)
        record_reprotections(job, supervisor)
        save_supervisor(client, job, supervisor)
        if not job.is_live:
            # The tick gave up on the job: no policy cycle may start replicas for it again.
            close_measurements(job, client)
            return False
        if time.monotonic() >= next_cycle:
            cycle_started = time.monotonic()
            config = Policy.current().to_config()
            supervisor.restart_policy = restart_policy_of(config)  # admin changes apply here
            supervisor.hung_timeout_s = config.hung_timeout_s
            ranked = nodes_by_q(client, config) or supervisor.nodes
            sync_replicas(job, client, supervisor)
            metrics.ingest_job_progress(client, job)
            if job.status == Job.Status.STARTING and supervisor.all_running():
                job.mark_running("every primary is running")
            ensure_generator(job, supervisor, client)
            policy_cycle(job, supervisor, client)
            if supervisor.definition.warm_spares:
                keep_warm_spares(client, config)
            save_supervisor(client, job, supervisor)
            recovery.measure_open_episodes(job, client, config)
            alert_slow_recoveries(job)
            record_cycle(client, job, time.monotonic() - cycle_started)
            next_cycle = time.monotonic() + config.cycle_interval_s
        time.sleep(TICK_S)
    return job.is_live
