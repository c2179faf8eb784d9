"""Act: side effects on processes, each idempotent. Replicas start and stop through the
node agents' Celery queues (`AgentLauncher`), commands go to a replica's control list,
the input generator and warm spares are asked for again every cycle.

Every command carries the token of the lease this thread acts under (control/fence.py).
"""

from __future__ import annotations

import json
import time

from django.conf import settings
from django.utils import timezone

from console.models import ControlDecision, Job, Node, Operator, Replica
from console.policy.checkpoint import stage_interval, state_store_confs
from console.policy.resources import node_capacities
from console.policy.spares import spare_needed, spares_wanted, stages_covered
from console.policy.strays import confirmed_strays
from console.services.control.commands import command_sender, send_kill
from console.services.control.fence import delete_state, lease_fields, write_state
from console.services.control.observe import (
    alive_nodes,
    node_history,
    read_agent_events,
    spares_by_state,
)
from console.services.control.record import (
    FAILURE_TAIL_LINES,
    alert_failed_job,
    decide,
    describe_actions,
    exit_returncode,
    failure_report,
)
from console.services.control.reserve import current_loads, hosts_of
from console.services.policy import policy_in_force
from infra import keys as control_keys
from infra import tasks
from infra.queues import node_queue
from spark_runtime import keys as data_keys
from spark_runtime.generators import GENERATED, generator_replica_id
from spark_runtime.jobdef import registered_app, resolve_topology
from spark_runtime.launch import STAGE_MODULE
from spark_runtime.replicas import (
    JOB,
    GiveUp,
    KillReplica,
    ReplicaSpec,
    RestartJob,
    RestartStage,
    StartReplica,
)
from spark_runtime.runner import stage_args
from spark_runtime.spare import REFILL_HOLD_S, hold_spare_refills
from spark_runtime.spare_plans import withdraw_plans
from spark_runtime.strategies import get_strategy
from spark_runtime.supervision import Supervisor, execute
from spark_runtime.upgrade import StopApp

# An agent's activity entry older than this (it publishes every second) does not count.
ACTIVITY_FRESH_S = 5.0


def checkpoint_root() -> str:
    """Where stage checkpoints live. Across hosts: shared storage (docs/DEPLOYMENT.md)."""
    return str(settings.BACKSTOP_CHECKPOINT_ROOT)


def stage_interval_of(job: Job, stage: str) -> float | None:
    """The checkpoint interval a stage should run with: the shortest of its operators'."""
    return stage_interval(
        Operator.objects.filter(job=job, stage=stage).values_list(
            "checkpoint_interval_s", flat=True
        )
    )


def trigger_of(job: Job) -> float:
    """The micro-batch trigger of a job's stages: its topology's (spark_runtime.topology)."""
    return resolve_topology(job.topology).trigger_s


class AgentLauncher:
    """A `Launcher` that starts and kills replicas through the node agents' queues. `nodes`:
    replica id -> its node, for replicas without a row (a job deleted from the database took
    its replica rows with it; the supervisor still knows where they run)."""

    def __init__(self, job: Job, client, nodes: dict[str, str] | None = None):
        self.job = job
        self.client = client
        self.nodes = nodes or {}

    def start(self, replica: ReplicaSpec) -> None:
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
        self.resend_start(replica)

    def resend_start(self, replica: ReplicaSpec) -> None:
        """Ask the replica's node agent to start it (a running one is left alone there)."""
        trigger = trigger_of(self.job)
        interval = stage_interval_of(self.job, replica.stage)
        args = stage_args(
            replica,
            settings.REDIS_URL,
            checkpoint_root(),
            trigger_seconds=trigger,
            # Started with its stage's interval in force; later changes: roll_out_intervals.
            checkpoint_interval_s=interval,
            spark_conf=state_store_confs(interval, trigger) if interval else None,
            # The policy in force when it starts; a changed value reaches replicas as they
            # (re)start, as an interval does not need to: it only bounds added latency.
            light_input_wait_s=policy_in_force().light_input_wait_s,
        )
        tasks.send(
            tasks.START_REPLICA,
            STAGE_MODULE,
            args,
            replica.replica_id,
            self.job.key,
            warm=replica.warm,
            queue=node_queue(replica.node),
            **lease_fields(),
        )

    def kill(self, replica_id: str) -> None:
        row = Replica.objects.filter(replica_id=self._db_id(replica_id)).first()
        if row is None:
            node = self.nodes.get(replica_id)
            if node is not None:
                send_kill(self.job.key, replica_id, node)
            return
        send_kill(self.job.key, replica_id, row.node.name)
        Replica.objects.filter(pk=row.pk).update(
            state=Replica.State.STOPPED, ended_at=timezone.now()
        )

    def alive(self, replica_id: str) -> bool:
        return not self.client.hexists(self._exits_key(), replica_id)

    def exit_code(self, replica_id: str) -> int | None:
        return exit_returncode(self.client.hget(self._exits_key(), replica_id))

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
        return Replica.full_id(self.job.key, replica_id)


# Actions that start a replica process (under an id the supervisor gave out), or stop an app
# for its upgrade (a successor that knew nothing of the upgrade would restart the stopped app
# as a failure and abandon the upgrade).
STARTING_ACTIONS = (StartReplica, RestartStage, RestartJob, StopApp)


def carry_out(job: Job, supervisor: Supervisor, client, actions: list, launcher=None) -> None:
    """Carry out the supervisor's `actions`. When one starts a replica, the supervision state
    that names it is saved first (under this thread's lease, LeaseLost if another holds it):
    a controller paused after the start and before its end-of-reconcile save would otherwise
    leave its successor an older state, whose next replica id is the one just started, and the
    successor would start that id a second time on another node (seen in the fleet
    simulator's chaos run). Saved first, the successor sends the same start again instead,
    which the agent leaves alone."""
    if any(isinstance(action, STARTING_ACTIONS) for action in actions):
        state = json.dumps(supervisor.to_dict())
        write_state(client, job.key, control_keys.controller_state(job.key), state)
    execute(actions, launcher or AgentLauncher(job, client), command_sender(client, job))


def stop_generator(job: Job) -> None:
    """Ask every node to kill the job's input generator (it runs on one of them)."""
    for node in Node.objects.values_list("name", flat=True):
        send_kill(job.key, generator_replica_id(job.key), node)


def input_written(job: Job, client) -> int:
    """Input entries written so far: the input stream's length, or for a job reading Kafka what
    its generator counted in the topic when it last finished."""
    if job.source:
        return int(client.hget(data_keys.stats(job.key), GENERATED) or 0)
    return client.xlen(data_keys.input_stream(job.key))


def ensure_generator(job: Job, supervisor: Supervisor, client, alive=None) -> None:
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
    if count is not None and input_written(job, client) >= int(count):
        return
    alive = alive_nodes(client) if alive is None else alive
    node = client.get(control_keys.generator_node(job.key))
    if node not in alive:
        node = supervisor.placement_by_stage()[supervisor.stages[0]][0]
        if node not in alive:
            node = min(alive, default=None)
        if node is None:
            return
        client.set(control_keys.generator_node(job.key), node)
    tasks.send(
        tasks.START_GENERATOR,
        job.key,
        job.topology,
        rate,
        int(job.params.get("seed", 0)),
        count,
        queue=node_queue(node),
        expires_s=30,
        **lease_fields(),
    )


# How long a spare a cycle asked a node for counts as held there (`keep_warm_spares`): a few of
# the agents' 1 s reconciliations, in which the agent registers it as starting.
SPARE_ASK_S = 5


def keep_warm_spares(
    client, config, placements: dict, reprotecting: bool = False, view=None
) -> dict[str, int]:
    """Tell each node agent how many warm spares to keep (policy setting, within the reserve).
    While any job re-protects a stage (`reprotecting`: this one does now), refills are held:
    the agents start no new spare (spark_runtime.spare.hold_spare_refills), so the standby catching
    up gets the CPU first; the spares follow once it is done. While the job lacks an idle spare
    where its next fault would start a process (`placements`: the supervisor's (primary node,
    standby node) per stage; console.policy.spares.spare_needed), the spares warming up are
    told to do it at the normal CPU priority; otherwise they are refills that take only the CPU
    nothing else wants (spark_runtime.spare.warming_nice). Only set here, never cleared: the
    flag expires two cycles after the last job's cycle that renewed it, so one job's cover does
    not cancel another's need."""
    if reprotecting:
        hold_spare_refills(client)
    beats = alive_nodes(client) if view is None else view.alive
    # Idle spares per alive node, as each agent's heartbeat reports them.
    idle = {name: int(beat.get("spares", 0)) for name, beat in beats.items()}
    if spare_needed(placements, idle):
        ttl_s = max(REFILL_HOLD_S, 2 * config.cycle_interval_s)
        client.set(data_keys.spare_needed(), "1", ex=round(ttl_s))
    history = node_history(client, beats) if view is None else view.history
    hosts = hosts_of(beats)
    # Spares warming up are kept where they are too: one host's spare is not stopped on one
    # node and started on another as Q changes. So are those a cycle asked for in the last
    # seconds and no agent has started yet: else another job's cycle, seeing none, may ask for
    # the host's spare on the node that covers its own stages, and one start is wasted. (Read
    # here, not with `view`: the fleet's view is a second old, and so is another job's ask.)
    names = list(beats)
    by_state = spares_by_state(client, names) if view is None else view.spares
    running = {name: sum(by_state.get(name, {}).values()) for name in names}
    ask_keys = [data_keys.spare_asked(name) for name in names]
    asks = client.mget(ask_keys) if ask_keys else []
    asked = {name: int(n) for name, n in zip(names, asks, strict=True) if n}
    wanted = spares_wanted(
        node_capacities(history, config),
        running,
        config,
        hosts,
        stages_covered(placements, names),
        measured=idle,
        asked=asked,
        loads=current_loads(history, beats) if config.hold_host_reserve else None,
    )
    with client.pipeline(transaction=False) as pipe:
        for name, count in wanted.items():
            pipe.set(data_keys.spares_wanted(name), count)
            if count > running.get(name, 0):
                # Not renewed while it waits: an ask the agent cannot fulfil soon (another
                # warm-up holds the machine's lock, or refills are held) stops binding.
                pipe.set(data_keys.spare_asked(name), count, ex=SPARE_ASK_S, nx=True)
            else:  # started, or given up for a host's started spares: nothing is pending
                pipe.delete(data_keys.spare_asked(name))
        pipe.execute()
    return wanted


def release_unused_spares(client) -> bool:
    """No spares where no live job can use them: when no live job's strategy takes over warm
    spares, every node's target is 0 (the agents stop theirs). Otherwise the targets stay as the
    jobs' cycles set them. Returns whether it released them. Spares hold a JVM each: left running
    under a job that cannot use them they only take memory and CPU (and would load the plain-Spark
    baseline of the benchmark)."""
    live = Job.objects.filter(status__in=Job.LIVE_STATUSES).values_list("strategy", "topology")
    # An existing app takes over spares under any strategy (SupervisorState.takes_warm_spares).
    if any(
        get_strategy(strategy).warm_spares or registered_app(topology) is not None
        for strategy, topology in live
    ):
        return False
    for node in Node.objects.values_list("name", flat=True):
        client.set(data_keys.spares_wanted(node), 0)
    return True


def stop_app_queries_first(job: Job, supervisor: Supervisor, client) -> bool:
    """A stopping app's queries are asked to stop before its process goes
    (Supervisor.ask_app_to_stop); True while the controller waits for them, and then the job
    is still stopping. The ask is saved with the supervision state before it is sent
    (`carry_out`), so a successor of a controller killed in between waits, then kills."""
    # The agents report the exit on their events stream; `alive` reads the exits copied from
    # there (a stopping job's reconcile runs no tick, which would read them).
    read_agent_events(client, job, {r.id: r.launched_at for r in supervisor.replicas.values()})
    launcher = AgentLauncher(job, client)
    noted = len(supervisor.history)
    actions = supervisor.ask_app_to_stop(time.time(), launcher.alive)
    for _, text in supervisor.history[noted:]:  # the ask, or that it went unanswered
        decide(job, ControlDecision.Kind.STOP, text)
    if actions is None:
        return False
    if actions:
        carry_out(job, supervisor, client, actions, launcher)
    return True


def stop_everything(job: Job, supervisor: Supervisor, client) -> None:
    """Kill the job's replicas and its generator; the sinks are idempotent, checkpoints stay.
    The supervision state goes last: a controller killed before that stops the job again (the
    kills are idempotent), one killed after it finds no state and marks the job stopped."""
    launcher = AgentLauncher(job, client)
    execute(supervisor.stop(), launcher, command_sender(client, job))
    stop_generator(job)
    withdraw_plans(client, job.key)
    Replica.objects.filter(job=job).exclude(
        state__in=(Replica.State.STOPPED, Replica.State.FAILED)
    ).update(state=Replica.State.STOPPED, ended_at=timezone.now())
    delete_state(client, job.key, control_keys.controller_state(job.key))


def stop_deleted_job(job: Job, supervisor: Supervisor | None, client) -> None:
    """A live job was deleted from the database (its replica rows went with it): kill its
    replicas where the supervisor placed them and its generator, and delete what the control
    plane keeps of it in Redis; its data (streams, results, checkpoints) is left as it is."""
    if supervisor is not None:
        nodes = {r.id: r.spec.node for r in supervisor.replicas.values()}
        launcher = AgentLauncher(job, client, nodes=nodes)
        execute(supervisor.stop(), launcher, command_sender(client, job))
    stop_generator(job)
    withdraw_plans(client, job.key)
    delete_state(client, job.key, *control_keys.controller_job_keys(job.key))


def apply_give_up(job: Job, client, replica_id: str, verdict: GiveUp, actions: list) -> None:
    """The state machine stopped restarting. Scope JOB: stop the generator, mark the job failed
    with a one-line cause and the failed replica's last log lines, and send the alert. A stage
    left without its standby is only recorded (the job keeps running)."""
    if verdict.scope != JOB:
        decide(job, ControlDecision.Kind.GIVE_UP, describe_actions([verdict]),
               stage=verdict.stage, replica_id=replica_id)  # fmt: skip
        return
    stop_generator(job)
    killed = [Replica.full_id(job.key, a.replica_id) for a in actions if isinstance(a, KillReplica)]
    Replica.objects.filter(replica_id__in=killed).update(
        state=Replica.State.FAILED, ended_at=timezone.now()
    )
    _, report = failure_report(client, job, replica_id, "")
    tail = report.splitlines()
    reason = f"gave up: {verdict.reason}"
    if tail:
        reason += f"\n\nlast log lines of {replica_id}:\n" + "\n".join(tail[-FAILURE_TAIL_LINES:])
    decide(job, ControlDecision.Kind.GIVE_UP, reason, stage=verdict.stage, replica_id=replica_id)
    if job.mark_failed(reason):
        alert_failed_job(job)


def kill_strays(job: Job, client, candidates: dict[str, dict]) -> list[str]:
    """Every policy cycle: kill the replicas that beat without being in the supervision state
    (`candidates`, from observe.sync_replicas) at this cycle and the one before, their
    heartbeat moving on in between (console.policy.strays); remember this cycle's candidates
    for the next. The kill is fenced like every other and idempotent at the agent. Returns the
    replica ids killed."""
    key = control_keys.job_strays(job.key)
    before = {replica_id: float(beat) for replica_id, beat in client.hgetall(key).items()}
    beats = {rid: float(entry.get("updated") or 0) for rid, entry in candidates.items()}
    strays = confirmed_strays(beats, before)
    if strays:
        nodes = {replica_id: candidates[replica_id].get("node") for replica_id in strays}
        launcher = AgentLauncher(job, client, nodes={k: v for k, v in nodes.items() if v})
        for replica_id in strays:
            launcher.kill(replica_id)
        decide(
            job,
            ControlDecision.Kind.KILL_STRAY,
            "killed "
            + ", ".join(f"{replica_id} on {nodes[replica_id] or '?'}" for replica_id in strays)
            + ": running, but not in the job's supervision state (a lost kill, or a start "
            "under a state that was lost)",
        )
    if beats or before:  # a job without strays, the common case, writes nothing
        with client.pipeline(transaction=False) as pipe:
            pipe.delete(key)
            if beats:
                pipe.hset(key, mapping=beats)
                pipe.expire(key, STRAYS_TTL_S)
            pipe.execute()
    return strays


# The candidates of a cycle are kept this long: the next cycle, however late, still finds them.
STRAYS_TTL_S = 3600
