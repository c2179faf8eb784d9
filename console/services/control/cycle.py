"""Decide (the policy): Algorithm 2 every policy cycle with fresh metrics, its actions
carried out through the state machine, and checkpoint intervals rolled out to running
replicas. Failures are decided by the state machine in the supervision tick
(console/services/controller.py)."""

from __future__ import annotations

import json
import time
from dataclasses import replace

from django.utils import timezone

from console.clock import utc
from console.models import ControlDecision, Job, MetricSample, Operator, Policy, Replica
from console.policy import actions as policy_actions
from console.policy.checkpoint import (
    ReplicaInterval,
    interval_rollout,
    stage_interval,
    state_store_confs,
)
from console.policy.placement import CycleInput, StandbyVerdict, run_cycle
from console.policy.priority import ACTIVE, measured_demands, operator_priorities
from console.policy.reserve import StandbyClaim
from console.services import prediction, recovery
from console.services.app_operators import adopt_app_operators
from console.services.control.act import carry_out, stage_interval_of, trigger_of
from console.services.control.commands import send_command
from console.services.control.observe import alive_nodes, node_history, stage_usage
from console.services.control.record import decide, priority_fields
from console.services.control.reserve import ReserveOutcome, apply_reserve
from infra import keys as control_keys
from spark_runtime import keys as data_keys
from spark_runtime.replicas import FAILED, RUNNING, STANDBY
from spark_runtime.supervision import Supervisor


def policy_cycle(
    job: Job, supervisor: Supervisor, client, view=None, samples=None, operators=None
) -> list:
    """Algorithm 2 with fresh metrics and the policy in force; apply and record its actions.

    Only the adaptive strategy lets the policy add, drop or move standbys; every strategy gets
    its passive stages' checkpoint intervals adjusted. `view` (console.services.fleet.FleetView):
    the policy and node samples a controller read once for all its jobs; None reads them now.
    `samples`: a list the cycle's MetricSample rows are added to, for the caller to insert with
    its own in one statement; None inserts them here. `operators`: the job's Operator rows by
    name as the caller keeps them between cycles (only the cycles change them once the job is
    launched); None reads them now.
    """
    if view is None:
        config = Policy.current().to_config()  # re-read every cycle: admin changes apply here
        beats = alive_nodes(client)
        history = node_history(client, beats)
        latest_model = prediction.latest_training()
    else:
        config, history, latest_model = view.config, view.history, view.latest_model
        beats = view.alive
    if not history:
        return []
    newest = [samples[0] for samples in history.values() if samples]
    if operators is None:
        operators = {op.name: op for op in job.operators.all()}
    # An app's operators found in its running queries' plans are scored like declared ones.
    topology = adopt_app_operators(job, supervisor, client, operators)
    stage_of = {op: name for name, ops in supervisor.stage_operators.items() for op in ops}
    # fr from the newest trained model where it is used, else the prior (with why).
    predicted = prediction.predicted_fault_rates(job, stage_of, config, latest=latest_model)
    # Once a stage runs, its operators are scored from what its process uses, not estimates.
    usage = stage_usage(client, job, supervisor)
    priorities = operator_priorities(
        topology,
        sum(s.cpu_total for s in newest),
        sum(s.mem_total for s in newest),
        config,
        demands=measured_demands(topology, supervisor.stage_operators, usage),
        fault_rates={name: fr for name, (fr, _) in predicted.items()},
    )
    now = timezone.now()
    placement = supervisor.placement_by_stage()
    primaries = {op: placement[stage][0] for op, stage in stage_of.items() if stage in placement}
    standbys = {}
    standby_age_s = {}
    moves_standbys = supervisor.definition.policy_moves_standbys
    for stage, ops in supervisor.stage_operators.items():
        standby = supervisor.standby_of(stage)
        top = top_operator(ops, priorities)
        if standby and top:
            standbys[top] = standby.spec.node
            # A standby still starting or being promoted has not settled anywhere: it is kept.
            running = standby.state == RUNNING
            standby_age_s[top] = time.time() - standby.launched_at if running else 0.0
    outcome = ReserveOutcome({}, {})
    # The strategy lets the policy drop and add standbys, and the policy holds the host reserve.
    if moves_standbys and config.hold_host_reserve:
        outcome = hold_reserve(
            job, supervisor, client, priorities, (primaries, standbys), (beats, history), config
        )
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
        vetoed=stage_vetoes(outcome.vetoed, supervisor.stage_operators, priorities),
    )
    result = run_cycle(state, config)
    actions = [
        replace(a, reason=f"restored: {outcome.restored[a.operator]}; {a.reason}")
        if isinstance(a, policy_actions.AddStandby) and a.operator in outcome.restored
        else a
        for a in result.actions
    ]
    if not moves_standbys:
        actions = [a for a in actions if isinstance(a, policy_actions.SetCheckpointInterval)]
    if supervisor.app:
        # An existing app's queries keep the trigger and state-store settings its own code
        # sets: its stage takes no interval command, so none is sent, stored or logged.
        actions = [a for a in actions if not isinstance(a, policy_actions.SetCheckpointInterval)]
    apply_cycle(job, supervisor, client, actions, stage_of, operators)
    if moves_standbys:
        for stage, ops in supervisor.stage_operators.items():
            verdict = result.verdicts.get(top_operator(ops, priorities))
            if verdict is not None:
                record_standby_verdict(job, supervisor, stage, verdict)
    if not supervisor.app:
        roll_out_intervals(job, supervisor, client, config, operators)
    rows = store_priorities(job, operators, priorities, predicted, now)
    if samples is None:
        MetricSample.objects.bulk_create(rows)
    else:
        samples.extend(rows)
    return actions


def hold_reserve(
    job: Job, supervisor: Supervisor, client, priorities, placed: tuple, fleet: tuple, config
) -> ReserveOutcome:
    """The host reserve's part of the cycle (console/services/control/reserve.py): publish a
    claim for each stage whose policy wants a standby (its top active operator's P_eff, the
    stage's measured demand as the standby's cost), and return which of them must run
    checkpoint-only and which are restored. `placed`: (primary node, standby node) by
    operator; `fleet`: (the alive nodes' heartbeats, their recent samples)."""
    primaries, standbys = placed
    beats, history = fleet
    now = time.time()
    wanted, top_of = [], {}
    for stage, ops in supervisor.stage_operators.items():
        top = top_operator(ops, priorities)
        if top is None:
            continue
        of_stage = [p for p in priorities if p.name in ops]
        key = f"{job.key}:{stage}"
        top_of[key] = top
        wanted.append(
            StandbyClaim(
                key=key,
                priority=next(p.P_eff for p in of_stage if p.name == top),
                primary_node=primaries.get(top),
                node=standbys.get(top),
                cpu=sum(p.cpu for p in of_stage),
                mem=sum(p.mem for p in of_stage),
                at=now,
            )
        )
    return apply_reserve(
        client, job.key, wanted, top_of, beats, history, config.resource_reserve, now
    )


def store_priorities(job: Job, operators: dict, priorities, predicted: dict, now) -> list:
    """The cycle's assessment of each operator: its row where a figure changed (one query for
    all of them, none when nothing did); returns its samples for the charts."""
    changed = []
    for p in priorities:
        op = operators[p.name]
        fields = {
            **priority_fields(p),
            "fault_rate_source": predicted.get(p.name, (0, "prior (runs in no stage)"))[1],
        }
        if any(getattr(op, name) != value for name, value in fields.items()):
            for name, value in fields.items():
                setattr(op, name, value)
            op.updated_at = now
            changed.append(op)
    if changed:
        Operator.objects.bulk_update(changed, [*fields, "updated_at"])
    return [
        MetricSample(at=now, job=job, stage=p.name, name=name, value=round(value, 4))
        for p in priorities
        for name, value in (
            ("priority", p.P_eff),
            ("type_score", p.S),
            ("resource_score", p.R),
            ("dependency_score", p.L),
            ("predicted_fault_rate", p.fr),
            ("checkpoint_interval_s", operators[p.name].checkpoint_interval_s),
        )
    ]


def roll_out_intervals(job: Job, supervisor: Supervisor, client, config, operators=None) -> list:
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
            since = utc(info["interval_since"])
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
        if operators is None:
            interval = stage_interval_of(job, stage)
        else:
            interval = stage_interval(
                op.checkpoint_interval_s for op in operators.values() if op.stage == stage
            )
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
    now = time.time()
    rollout = interval_rollout(wanted, live, now, config.interval_apply_gap_s, quiet=True)
    if rollout:  # only then ask the database whether this is a quiet moment
        gap_start = timezone.now() - timezone.timedelta(seconds=config.interval_apply_gap_s)
        quiet = not (
            job.recoveries.filter(watched_s__isnull=True).exists()
            or job.decisions.filter(kind=ControlDecision.Kind.FAILURE, at__gte=gap_start).exists()
        )
        rollout = interval_rollout(wanted, live, now, config.interval_apply_gap_s, quiet)
    for apply in rollout:
        confs = state_store_confs(apply.seconds, trigger_of(job))
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


def record_standby_verdict(
    job: Job, supervisor: Supervisor, stage: str, verdict: StandbyVerdict
) -> None:
    """Store why the stage's standby sits where it is on its replica row, for the placement page.
    Only a standby on the verdict's node gets it; writing it again only renews its time."""
    # During a move the stage has two standbys: the verdict is the one's on its node.
    standby = next(
        (r for r in supervisor.of_stage(stage, STANDBY)
         if r.state != FAILED and r.spec.node == verdict.node),
        None,
    )  # fmt: skip
    if standby is not None:
        Replica.objects.filter(replica_id=Replica.full_id(job.key, standby.id)).update(
            placement={**verdict.to_dict(), "at": timezone.now().isoformat()}
        )


def stage_vetoes(vetoed: dict[str, str], stage_operators, priorities) -> dict[str, str]:
    """The host reserve's vetoes (by each stage's top active operator) for every operator of
    the stage: a standby is the stage's, and Algorithm 2 added one back for the stage's next
    active operator in the very cycle that dropped it for the top one, every cycle (a 6-job
    density run logged 109 drops and as many adds for one stage in 15 minutes)."""
    out = {}
    for ops in stage_operators.values():
        why = vetoed.get(top_operator(ops, priorities) or "")
        if why is not None:
            out.update({name: why for name in ops})
    return out


def top_operator(names, priorities) -> str | None:
    """The stage's standby is attributed to its highest-priority active operator."""
    active = [p for p in priorities if p.name in names and p.mode == ACTIVE]
    return max(active, key=lambda p: (p.P_eff, p.name)).name if active else None


def apply_cycle(job, supervisor, client, actions, stage_of, operators=None) -> None:
    """Carry out Algorithm 2's actions through the state machine and record each with its reason.

    Standby changes start or kill replicas; an interval change is stored on the operator with the
    Spark settings it maps to (see console/policy/checkpoint.py), and roll_out_intervals brings
    it to the stage's running replicas.
    """
    now = time.time()
    if operators is None:
        operators = {op.name: op for op in job.operators.all()}
    for action in actions:
        stage = stage_of.get(action.operator, "")
        if isinstance(action, policy_actions.SetCheckpointInterval):
            op = operators.get(action.operator)
            if op is None or abs(op.checkpoint_interval_s - action.seconds) < 0.5:
                continue
            Operator.objects.filter(pk=op.pk).update(checkpoint_interval_s=action.seconds)
            op.checkpoint_interval_s = action.seconds
            kind, node, steps = ControlDecision.Kind.SET_INTERVAL, "", []
            detail = state_store_confs(action.seconds, trigger_of(job))
        elif isinstance(action, policy_actions.AddStandby):
            if supervisor.has_standby(stage):
                continue
            kind, node, detail = ControlDecision.Kind.ADD_STANDBY, action.node, {}
            steps = supervisor.add_standby(stage, action.node, now)
        elif isinstance(action, policy_actions.DropStandby):
            kind, node, detail = ControlDecision.Kind.DROP_STANDBY, action.node, {}
            steps = supervisor.drop_standby(stage)
        elif isinstance(action, policy_actions.MoveStandby):
            if stage in supervisor.retiring:
                continue  # a move of this stage is under way (its new standby catching up)
            kind, node, detail = ControlDecision.Kind.MOVE_STANDBY, action.to_node, {}
            steps = supervisor.move_standby(stage, node, now)
        else:
            raise TypeError(f"unknown policy action {action!r}")
        carry_out(job, supervisor, client, steps)
        decide(
            job, kind, action.reason, operator=action.operator, stage=stage, node=node,
            detail=detail,
        )  # fmt: skip
