"""The controller's loop: launch a job, then tick its supervision and run the policy cycle.

Each tick: observe (control/observe.py: agents' exits, heartbeats, replica reports), decide (the
data plane's state machine `spark_runtime.supervision.Supervisor` for failures; the policy's
Algorithm 2 in control/cycle.py every policy cycle), act (control/act.py: replicas started and
killed through the node agents' Celery queues, commands, the generator, warm spares), and record
(control/record.py: decisions and recovery episodes). Every act is idempotent and the
Supervisor's state is saved in Redis after every tick, so a controller that dies and comes back
picks up where it was. Celery tasks in workers/controller.py call into here.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta

from confluent_kafka import KafkaException
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from console.models import ControlDecision, Job, Policy, Replica
from console.policy import redis_loss
from console.policy.spares import standby_node_preference
from console.redis import redis_client
from console.services import kafka_status, metrics, recovery, upgrade_control
from console.services.control.act import (
    AgentLauncher,
    apply_give_up,
    carry_out,
    ensure_generator,
    keep_warm_spares,
    kill_strays,
    stop_app_queries_first,
    stop_everything,
    stop_generator,
)
from console.services.control.commands import command_sender, send_kill
from console.services.control.cycle import policy_cycle, record_standby_verdict
from console.services.control.fence import acting_under, write_state
from console.services.control.observe import (
    alive_nodes,
    load_supervisor,
    node_history,
    read_agent_events,
    sync_replicas,
)
from console.services.control.record import (
    alert_failed_job,
    alert_slow_recoveries,
    clear_alerts_of_ended_job,
    close_measurements,
    decide,
    decision_kinds,
    describe_actions,
    mark_commanded,
    raise_supervision_alerts,
    record_cycle,
    record_failure,
    record_promotion_over_restart,
    record_reprotections,
    store_assessment,
    watch_conditions,
    watch_kafka,
)
from console.services.control.reserve import launch_refusal
from console.services.jobs import job_external_io
from console.services.planning import JobPlan, plan_job
from console.services.upgrades import as_cli_params, current_upgrade_params
from infra import keys as control_keys
from infra import leases
from spark_runtime import external_io
from spark_runtime import keys as data_keys
from spark_runtime import upgrade as upgrades
from spark_runtime.apps import AppDefinition
from spark_runtime.jobdef import resolve_topology
from spark_runtime.kafka_admin import ensure_topics
from spark_runtime.replicas import (
    BACKOFF,
    FAILED,
    PRIMARY,
    PROMOTING,
    RUNNING,
    STARTING,
    GiveUp,
    HeartbeatSeen,
    KillReplica,
    PromoteStandby,
    ScheduleRestart,
)
from spark_runtime.runner import observe
from spark_runtime.sink import FENCE_LOST
from spark_runtime.spare_plans import publish_plans, stage_plans
from spark_runtime.supervision import RestartPolicy, Supervisor, execute


class LaunchError(Exception):
    """The job cannot be placed (no node alive, unknown strategy)."""


class LaunchBusy(Exception):
    """Another holds the job's lease (a controller still stopping it): launch it later."""


# A launch holds the job's lease this long: planning, the topics and the starts take seconds.
# A launcher killed midway keeps the job from the controllers no longer than this; one that
# outlives it finds its starts refused, and the controller that takes the job sends them again.
LAUNCH_LEASE_S = 30.0


def restart_policy_of(config) -> RestartPolicy:
    """The state machine's restart policy from the policy in force (console.policy.config)."""
    return RestartPolicy(
        initial_delay_s=config.restart_initial_delay_s,
        max_delay_s=config.restart_max_delay_s,
        max_failures=config.restart_max_failures,
        failure_window_s=config.restart_failure_window_s,
        same_cause_failures_limit=config.same_cause_failures_limit,
    )


def launch_job(job: Job) -> JobPlan | None:
    """Plan the job with the policy in force, record the assessment, start its replicas, all
    under a lease of its own on the job (its commands fenced as a controller's are); given up
    at the end, for a controller to take the job.

    A failed job whose supervision state is kept (the supervisor gave up on it) is relaunched
    instead (no plan): every stage resumes its last
    primary's checkpoint, so the results continue where they stopped.
    """
    client = redis_client()
    lease = leases.Leases(client, f"launch:{socket.gethostname()}:{os.getpid()}", LAUNCH_LEASE_S)
    token = lease.try_acquire(job.key)
    if token is None:
        holder = leases.holders(client, [job.key])[job.key]
        raise LaunchBusy(f"the lease of {job.key} is held by {holder}")
    try:
        with acting_under(token):
            return _launch(job, client)
    finally:
        lease.release(job.key)


def _launch(job: Job, client) -> JobPlan | None:
    """launch_job, under the launch's lease."""
    if any(epoch == FENCE_LOST for epoch in what_remains(client, job).fences.values()):
        raise LaunchError(
            "Redis lost this job's data (its stages are fenced off); it cannot continue "
            "exactly-once: create it again as a new job"
        )
    config = Policy.current().to_config()
    saved = load_supervisor(client, job)
    if saved is not None and job.status == Job.Status.FAILED:
        relaunch_given_up(job, saved, client, config)
        return None
    nodes = alive_nodes(client)
    topology = resolve_topology(job.topology)
    history = node_history(client, nodes)
    try:
        plan = plan_job(topology, job.strategy, history, config)
    except ValueError as exc:
        raise LaunchError(str(exc)) from exc
    refusal = (
        launch_refusal(nodes, history, plan.primary_demands(), config.resource_reserve)
        if config.hold_host_reserve
        else None
    )
    if refusal is not None:
        raise LaunchError(f"refused: {refusal}")
    supervisor = Supervisor(
        job.key,
        job.topology,
        {s.name: s.operators for s in plan.stages},
        job.strategy,
        sorted(nodes),
        active_stages={s.name for s in plan.stages if s.standby_node},
        # The operator parameters of the job's last confirmed upgrade: a job stopped and
        # started again runs what it ran.
        params=as_cli_params(current_upgrade_params(job)),
        placement={s.name: (s.primary_node, s.standby_node) for s in plan.stages},
        restart_policy=restart_policy_of(config),
        hung_timeout_s=config.hung_timeout_s,
        app=isinstance(topology.job, AppDefinition),
    )
    # The supervision state is saved before the job turns live: the watchdog supervises every
    # live job, and a window that found no state would fail the job ("supervision state lost").
    # Saved with its replicas already starting, so a controller killed before they are asked to
    # start leaves replicas that never heartbeat, which supervision restarts.
    start_actions = supervisor.start(time.time())
    write_supervisor(client, job, supervisor)
    job.mark_starting(f"placing {len(plan.stages)} stages on {', '.join(sorted(nodes))}")
    store_assessment(job, plan)
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
    prepare_external_io(job, client)
    prepare_app_args(job, client)
    execute(start_actions, AgentLauncher(job, client), command_sender(client, job))
    for stage in plan.stages:
        if stage.standby_verdict is not None:
            record_standby_verdict(job, supervisor, stage.name, stage.standby_verdict)
    return plan


def write_supervisor(client, job: Job, supervisor: Supervisor) -> None:
    """Write the job's supervision state under the lease this thread acts under (created if
    missing: a launch's first state)."""
    state = json.dumps(supervisor.to_dict())
    write_state(client, job.key, control_keys.controller_state(job.key), state, create=True)


def reissue_pending(job: Job, supervisor: Supervisor, client) -> int:
    """Send again what the supervisor waits for and a predecessor may have sent under a lease
    the receivers now refuse: the start of every replica still starting (unless its exit is
    recorded) and the promotion of every standby taking over. Both are idempotent at their
    receivers (an agent leaves a running replica alone, a primary ignores a promotion), so a
    controller taking a job over, or reloading it after a failed reconcile, runs it. Returns
    how many commands it sent."""
    launcher = AgentLauncher(job, client)
    sent = 0
    for replica in supervisor.replicas.values():
        if replica.state == STARTING and launcher.alive(replica.id):
            launcher.resend_start(replica.spec)
            sent += 1
        elif replica.state == PROMOTING:
            command_sender(client, job)(replica.id, {"cmd": "promote"})
            sent += 1
    return sent


def prepare_external_io(job: Job, client) -> None:
    """Record the job's Kafka source and sink for its replicas and create the topics it
    writes, before any replica starts (both idempotent). A Kafka cluster that does not answer
    fails the launch with the cause."""
    if not job.source and not job.sink:
        external_io.save(client, job.key, external_io.ExternalIO())
        return
    io = job_external_io(job, settings.KAFKA_BOOTSTRAP_SERVERS or "")
    try:
        ensure_topics(io, with_input=bool(job.source) and job.params.get("rate", 0) > 0)
    except KafkaException as exc:
        raise LaunchError(
            f"Kafka at {settings.KAFKA_BOOTSTRAP_SERVERS} does not answer: {exc.args[0].str()}"
        ) from exc
    external_io.save(client, job.key, io)


def prepare_app_args(job: Job, client) -> None:
    """Record an app's arguments (its sys.argv[1:]) for its replicas, before any starts: every
    replica, on any node, reads them there (spark_runtime/stage.py, `app_arguments`)."""
    if job.args:
        client.set(data_keys.app_args(job.key), json.dumps(job.args))
    else:
        client.delete(data_keys.app_args(job.key))


def relaunch_given_up(job: Job, supervisor: Supervisor, client, config) -> None:
    """Start a failed job again from its checkpoints. The state is saved before anything is
    started, so a controller killed midway leaves a job whose missing processes the next
    supervision tick sees as exited and restarts."""
    supervisor.restart_policy = restart_policy_of(config)
    supervisor.hung_timeout_s = config.hung_timeout_s
    actions = supervisor.relaunch(time.time())
    write_supervisor(client, job, supervisor)
    job.mark_starting("relaunched from the checkpoints after giving up")
    decide(job, ControlDecision.Kind.RESTART_JOB, "relaunch: " + describe_actions(actions))
    prepare_external_io(job, client)
    prepare_app_args(job, client)
    execute(actions, AgentLauncher(job, client), command_sender(client, job))


@dataclass
class TickReport:
    """What one supervision tick saw and did (for logs and tests)."""

    events: int = 0
    actions: int = 0
    upgrade_woken: bool = False  # the console asked the job's controller to look at its upgrade


def supervise_tick(job: Job, supervisor: Supervisor, client) -> TickReport:
    """One round: observe replicas, let the state machine decide, act, record the decisions."""
    report = TickReport()
    launched_at = {r.id: r.launched_at for r in supervisor.replicas.values()}
    report.upgrade_woken = read_agent_events(client, job, launched_at)
    launcher = AgentLauncher(job, client)
    now = time.time()
    due = supervisor.tick(now)
    if due:
        report.actions += len(due)
        kind, _ = decision_kinds(due)
        decide(job, kind, "backoff over: " + describe_actions(due))
        carry_out(job, supervisor, client, due, launcher)
    for event in observe(supervisor, launcher, client, job.key, now):
        # Which run of the replica the event is about (handle() may relaunch it).
        watched = supervisor.replicas.get(event.replica_id)
        launched_at = watched.launched_at if watched else now
        phase_before = upgrade_phase(supervisor)
        actions = supervisor.handle(event)
        decided_at = time.time()
        if not actions:
            continue
        episode = None
        report.events += 1
        report.actions += len(actions)
        if isinstance(event, HeartbeatSeen) and upgrade_phase(supervisor) != phase_before:
            pass  # a step of an upgrade: its record says so (console.services.upgrade_control)
        elif app_stopped_for_upgrade(supervisor, phase_before):
            # The app's old version ended as its upgrade asked: no failure, the new version
            # starts (its record and decisions say so).
            decide(
                job,
                ControlDecision.Kind.UPGRADE,
                f"upgrade {phase_before[0]}: {event.replica_id} ended; "
                + describe_actions(actions),
                replica_id=event.replica_id,
            )
        elif isinstance(event, HeartbeatSeen) and any(
            isinstance(a, PromoteStandby) for a in actions
        ):
            record_promotion_over_restart(job, event, actions)
        elif isinstance(event, HeartbeatSeen):
            # Not a failure: a promotion completed and the machine asks for a new standby.
            Replica.objects.filter(replica_id=Replica.full_id(job.key, event.replica_id)).update(
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
            episode = record_failure(job, client, event, actions, launched_at, decided_at)
        carry_out(job, supervisor, client, actions, launcher)
        mark_commanded(episode, time.time())
        waiting = [
            Replica.full_id(job.key, a.replica_id)
            for a in actions
            if isinstance(a, ScheduleRestart)
        ]
        if waiting:  # shown as waiting out the backoff until tick() restarts them
            Replica.objects.filter(replica_id__in=waiting).update(state=Replica.State.BACKOFF)
        for verdict in (a for a in actions if isinstance(a, GiveUp)):
            apply_give_up(job, client, event.replica_id, verdict, actions)
        # Other observations of this round may be stale after an action: look again next tick.
        break
    return report


def job_ended(job: Job, client) -> None:
    """The job stopped or failed: its open measurements and its upgrade under way end, and its
    alerts resolve but the one saying it failed (record.clear_alerts_of_ended_job)."""
    close_measurements(job, client)
    clear_alerts_of_ended_job(job, client)
    upgrade_control.end_open_upgrades(job, f"the job is {job.status}: {job.status_reason}")


def app_stopped_for_upgrade(supervisor: Supervisor, phase_before: tuple | None) -> bool:
    """Whether the event just handled was an app's old version ending while its upgrade waited
    for that (spark_runtime.upgrade, APP_RESTART: handing over -> validating)."""
    machine = supervisor.upgrade
    return (
        machine is not None
        and machine.mode == upgrades.APP_RESTART
        and phase_before == (machine.upgrade_id, upgrades.HANDING_OVER)
        and machine.phase == upgrades.VALIDATING
    )


def upgrade_phase(supervisor: Supervisor) -> tuple | None:
    """(upgrade id, phase) of the supervisor's upgrade, None without one."""
    machine = supervisor.upgrade
    return (machine.upgrade_id, machine.phase) if machine else None


def without_state(job: Job, client) -> None:
    """A job held for supervision whose supervision state is gone. Stopping or stopped: its
    last holder ran stop_everything (which deletes the state last), and may have died before
    marking the job stopped. Its kills may still have been refused: sent under its lease, they
    reached an agent only after another controller had taken the lease (seen in the 200-job
    chaos run: a stop left two processes running). So they are sent again under ours, which is
    harmless when they were carried out. Live: the state was lost (Redis lost it), see
    `lost_state`."""
    if job.status in (Job.Status.STOPPING, Job.Status.STOPPED):
        kill_again(job, client)
    if job.status == Job.Status.STOPPING:
        job.mark_stopped(job.status_reason or "stopped")
        job_ended(job, client)
    elif job.is_live:
        lost_state(job, client)


# A stop's kills that were refused were sent at most this long before a successor finds the
# job without state: as long as a released lease stays readable (infra/leases.py).
KILL_AGAIN_WITHIN_S = leases.RELEASED_KEEP_S


def kill_again(job: Job, client) -> None:
    """Kill again, under this thread's lease, the job's replicas that were running or ended
    within KILL_AGAIN_WITHIN_S, and its generator (idempotent: an agent kills only what runs).
    A row that had ended keeps its state and end time: only the kill is repeated."""
    now = timezone.now()
    recent = now - timedelta(seconds=KILL_AGAIN_WITHIN_S)
    rows = job.replicas.filter(Q(ended_at__isnull=True) | Q(ended_at__gte=recent))
    for row in rows.select_related("node"):
        send_kill(job.key, row.local_id, row.node.name)
    rows.filter(ended_at__isnull=True).update(state=Replica.State.STOPPED, ended_at=now)
    stop_generator(job)


def what_remains(client, job: Job) -> redis_loss.Remains:
    """What Redis holds of the job's data: the fencing epoch and sink watermarks of every stage
    it ran (its replica rows), its input stream and its results, in one round trip."""
    stages = sorted(set(job.replicas.values_list("stage", flat=True)))
    pipe = client.pipeline(transaction=False)
    # A job reading Kafka keeps its input there; its order (the plan log) is what Redis holds.
    pipe.exists(data_keys.kafka_plans(job.key) if job.source else data_keys.input_stream(job.key))
    pipe.exists(data_keys.results(job.key), data_keys.output_stream(job.key))
    for stage in stages:
        pipe.get(data_keys.fence(job.key, stage))
    for stage in stages:
        pipe.exists(data_keys.watermarks(job.key, stage))
    found = pipe.execute()
    epochs, marks = found[2 : 2 + len(stages)], found[2 + len(stages) :]
    return redis_loss.Remains(
        fences={
            s: (e.decode() if isinstance(e, bytes) else e)
            for s, e in zip(stages, epochs, strict=True)
        },
        input_stream=bool(found[0]),
        results=bool(found[1]),
        watermarks={s: bool(m) for s, m in zip(stages, marks, strict=True)},
    )


def lost_state(job: Job, client) -> None:
    """A live job's supervision state is gone (console/policy/redis_loss.py). Its data gone too:
    every stage is fenced off first (no running writer can write again, no replica can take
    over), then its processes are stopped and it fails with what was lost. Only the state
    gone: its processes are stopped and it fails, to be restarted from its checkpoints."""
    remains = what_remains(client, job)
    verdict = redis_loss.judge(remains)
    if verdict.data_lost:
        pipe = client.pipeline(transaction=False)
        for stage in remains.fences:
            pipe.set(data_keys.fence(job.key, stage), FENCE_LOST)
        pipe.execute()
    launcher = AgentLauncher(job, client)
    running = job.replicas.exclude(state__in=(Replica.State.STOPPED, Replica.State.FAILED))
    for row in running:
        launcher.kill(row.local_id)
    stop_generator(job)
    decide(job, ControlDecision.Kind.GIVE_UP, verdict.reason)
    if job.mark_failed(verdict.reason):
        alert_failed_job(job)
    upgrade_control.end_open_upgrades(job, verdict.reason)


def reconcile_job(job: Job, supervisor: Supervisor, client, view, slot) -> bool:
    """One reconcile of a live job (console.services.fleet): carry out a stop request, tick its
    supervision, and run its policy cycle when due (`slot.next_cycle`, on the monotonic clock).
    `view` holds the reads every job shares (policy, nodes, spares). Returns whether the job is
    still live; the caller saves the supervision state after it."""
    if job.status == Job.Status.STOPPING:
        if stop_app_queries_first(job, supervisor, client):
            return True
        stop_everything(job, supervisor, client)
        job.mark_stopped(job.status_reason or "stopped")
        job_ended(job, client)
        return False
    if not job.is_live:
        job_ended(job, client)
        return False
    # A standby the supervisor starts on its own (after a promotion) goes where a warm spare is
    # ready or warming, else to the best node by Q.
    supervisor.standby_nodes = standby_node_preference(view.ranked or supervisor.nodes, view.spares)
    report = supervise_tick(job, supervisor, client)
    record_reprotections(job, supervisor)
    if report.upgrade_woken or slot.upgrade_open or upgrade_moved(supervisor, slot):
        look_at_upgrade(job, supervisor, client, slot)
    if supervisor.strategy != job.strategy:
        reconcile_strategy(job, supervisor, client)
    if not job.is_live:
        # The tick gave up on the job: no policy cycle may start replicas for it again.
        job_ended(job, client)
        return False
    raise_supervision_alerts(job, supervisor, client, view.config)
    if time.monotonic() >= slot.next_cycle:
        cycle_started = time.monotonic()
        if slot.operators is None:
            slot.operators = {op.name: op for op in job.operators.all()}
        policy_step(job, supervisor, client, view, slot.operators)
        record_cycle(client, job, time.monotonic() - cycle_started)
        slot.next_cycle = time.monotonic() + view.config.cycle_interval_s
        slot.next_watch = time.monotonic() + CONDITIONS_EVERY_S
    elif time.monotonic() >= slot.next_watch:
        watch_between_cycles(job, supervisor, client, view.config, slot)
        slot.next_watch = time.monotonic() + CONDITIONS_EVERY_S
    return True


# How often a job's alert conditions are looked at between its policy cycles (every
# cycle_interval_s, 5 s by default): a condition that turns true is raised within about this
# long (plus the reconcile's own cadence), for the goal of a page within 5 s of it
# (docs/ALERTING.md). A look reads Redis only and writes only a condition that is new.
CONDITIONS_EVERY_S = 1.0


def watch_between_cycles(job: Job, supervisor: Supervisor, client, config, slot) -> None:
    """Look at the job's alert conditions on the progress records since the last look, and at
    a Kafka source that cannot read, and raise those new since (record.watch_conditions,
    fresh_only). The policy cycle stores the records, counts repeats, clears what no longer
    holds and watches the Kafka lag (it counts once over the bound at two cycles)."""
    progress, slot.progress_seen = metrics.progress_after(client, job.key, slot.progress_seen)
    source = kafka_status.source_due_now(client, job)
    watch_conditions(job, supervisor, client, config, progress, source, fresh_only=True)


def upgrade_moved(supervisor: Supervisor, slot) -> bool:
    """Whether the supervisor's upgrade needs a look: it is under way (a phase may be due, a
    confirm or rollback asked by hand), or it moved since its record was last written. A record
    under way that the supervisor does not know (not started yet, or started by a controller
    that died before saving its state) is found by `slot.upgrade_open` (console.services.fleet:
    read from the database for every held job once a round, and true at a take-over)."""
    machine = supervisor.upgrade
    if machine is None:
        return False
    return machine.under_way or slot.upgrade_seen != (machine.upgrade_id, machine.phase)


def look_at_upgrade(job: Job, supervisor: Supervisor, client, slot) -> None:
    """Act on the job's upgrade (console.services.upgrade_control) and record where it stands."""
    # Looked at now: the fleet's next round says again whether a record is under way (a
    # wake-up is only a hint to look sooner; it is consumed before the state is saved).
    slot.upgrade_open = False
    actions = upgrade_control.reconcile_upgrade(job, supervisor, time.time(), client)
    if actions:
        carry_out(job, supervisor, client, actions)
    machine = supervisor.upgrade
    slot.upgrade_seen = (machine.upgrade_id, machine.phase) if machine else None


def reconcile_strategy(job: Job, supervisor: Supervisor, client) -> None:
    """Bring the supervisor to the job's strategy, which an upgrade changed (console.services.
    upgrades.change_strategy records it first): standbys started or stopped for it. Run by
    every reconcile that finds the two apart, so a controller killed after the change was
    recorded makes it at its next one."""
    before = supervisor.strategy
    actions = supervisor.change_strategy(job.strategy, time.time())
    decide(
        job,
        ControlDecision.Kind.DROP_STANDBY
        if any(isinstance(a, KillReplica) for a in actions)
        else ControlDecision.Kind.ADD_STANDBY,
        f"strategy {before} -> {job.strategy}: "
        + (describe_actions(actions) if actions else "the standbys there are stay"),
    )
    carry_out(job, supervisor, client, actions)


def policy_step(job: Job, supervisor: Supervisor, client, view, operators: dict) -> None:
    """Every policy cycle: the policy in force applied to the state machine, replica rows
    synced, progress stored, Algorithm 2 (on `operators`, the job's Operator rows the fleet
    keeps between cycles), the input generator and warm spares asked for, open recovery
    episodes measured and alerted on, a Kafka job's source and lag watched for alerts, and the
    conditions ops teams page on raised or cleared (record.watch_conditions)."""
    config = view.config
    supervisor.restart_policy = restart_policy_of(config)  # admin changes apply here
    supervisor.hung_timeout_s = config.hung_timeout_s
    strays = sync_replicas(job, client, supervisor)
    kill_strays(job, client, strays)
    if job.status == Job.Status.STARTING and supervisor.all_running():
        job.mark_running("every primary is running")
    ensure_generator(job, supervisor, client, view.alive)
    samples = []
    policy_cycle(job, supervisor, client, view, samples=samples, operators=operators)
    progress = []
    metrics.ingest_job_progress(client, job, also=samples, records_out=progress)  # one insert
    if supervisor.takes_warm_spares:
        keep_warm_spares(
            client,
            config,
            supervisor.placement_by_stage(),
            reprotecting=bool(supervisor.unprotected_since),
            view=view,
        )
    if supervisor.definition.warm_spares and not supervisor.app:
        # What the spares warm up: the plans of the stages they may take over. An app has none
        # a spare could run: its queries read and write where its code says, so a spare runs
        # only its own warm-up (spark_runtime.spare.warm_up).
        publish_plans(
            client,
            job.key,
            stage_plans(
                supervisor.topology,
                supervisor.stage_operators,
                supervisor.params,
                supervisor.active_stages,
            ),
        )
    recovery.measure_open_episodes(job, client, config)
    alert_slow_recoveries(job, view.recovery_alerts)
    primaries = [r.id for r in supervisor.replicas.values() if r.role == PRIMARY]
    kafka_due = watch_kafka(job, client, config, primaries)
    watch_conditions(job, supervisor, client, config, progress, kafka_due)


# Replica states in which nothing waits on the controller.
SETTLED_STATES = {RUNNING, BACKOFF, FAILED}


def next_reconcile_s(job: Job, supervisor: Supervisor, fast_s: float, steady_s: float) -> float:
    """When to reconcile the job again: soon (`fast_s`) while it starts, fails over, catches a
    standby up or restarts a stage; else `steady_s` (an agent's exit report wakes it at once
    anyway); never after a backoff ends."""
    changing = (
        job.status != Job.Status.RUNNING
        or bool(supervisor.unprotected_since or supervisor.restarting)
        or (supervisor.upgrade is not None and supervisor.upgrade.under_way)
        or any(r.state not in SETTLED_STATES for r in supervisor.replicas.values())
    )
    delay = fast_s if changing else steady_s
    retries = [r.retry_at for r in supervisor.replicas.values() if r.state == BACKOFF]
    if retries:
        delay = min(delay, max(0.0, min(retries) - time.time()))
    return delay
