"""Record: the decision log, failures and their recovery episodes, re-protect times,
alerts. Every write here is what the console, the API and the reports show about what the
controller did and why."""

from __future__ import annotations

import json
import logging
import signal
import time

from django.db import transaction
from django.utils import timezone

from console.clock import utc
from console.models import (
    Alert,
    ControlDecision,
    FaultInjection,
    Job,
    Operator,
    Policy,
    RecoveryEpisode,
    Replica,
    ReportSubscription,
)
from console.policy import alert_conditions
from console.policy.config import PolicyConfig
from console.services import alert_routing, kafka_status, recovery
from console.services.alerts import kafka_subscriptions, recovery_elapsed_s
from console.services.planning import JobPlan
from infra import keys as control_keys
from infra import tasks
from spark_runtime import keys as data_keys
from spark_runtime.replicas import (
    JOB,
    GiveUp,
    HeartbeatSeen,
    KillReplica,
    PromoteStandby,
    RestartJob,
    RestartStage,
    ScheduleRestart,
    StartReplica,
)
from spark_runtime.supervision import Supervisor
from spark_runtime.upgrade import StopApp

log = logging.getLogger(__name__)


# Log lines of the failed replica kept in a job's failure reason.
FAILURE_TAIL_LINES = 20


def decide(job: Job, kind: str, reason: str, **fields) -> ControlDecision:
    """Record a controller decision (shown on the job page) and log it."""
    log.info("job %s: %s %s", job.key, kind, reason)
    return ControlDecision.objects.create(job=job, kind=kind, reason=reason, **fields)


def exit_returncode(exit_info: str | None) -> int | None:
    """The return code in an agent's exit report (JSON, as in the job's exits hash); None with
    no report, or when the agent could not know it (`returncode` "": a process it adopted)."""
    raw = json.loads(exit_info)["returncode"] if exit_info else ""
    return int(raw) if raw != "" else None


def exit_status(returncode: int | None, event_name: str, reported: bool = False) -> str:
    """How a replica ended, in words (a negative return code is the signal that killed it);
    `reported`: its agent saw it exit, with no code (`exit_returncode`)."""
    if returncode is None and reported:
        return "exited (its code unknown to the agent that adopted it)"
    if returncode is None:
        return "heartbeat missed" if event_name == "HeartbeatMissed" else event_name
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    meaning = {1: "query failed", 3: "fenced by a newer primary", 4: "promotion impossible"}
    known = f" ({meaning[returncode]})" if returncode in meaning else ""
    return f"exited with code {returncode}{known}"


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
        elif isinstance(action, StopApp):
            words.append(f"ask {action.replica_id} to stop its queries and exit ({action.why})")
        elif isinstance(action, GiveUp) and action.scope == JOB:
            words.append(f"give up the job: {action.reason}")
        elif isinstance(action, GiveUp):
            words.append(f"run {action.stage} without a standby: {action.reason}")
    return "; ".join(words)


# A replica's own report of its failure counts only if written this recently: an older entry
# is from an earlier run of the same replica id.
OWN_REPORT_FRESH_S = 10.0


def failure_report(client, job: Job, replica_id: str, event_name: str) -> tuple[str, str]:
    """(one line, error tail) saying how a replica failed: the exit its agent reported (or how
    the supervisor saw it, "heartbeat missed"), with the cause the replica wrote in its own
    entry when its query failed. A stage whose query failed writes the cause, then takes a few
    seconds to exit, so its silent heartbeat is often seen before its exit."""
    exit_info = client.hget(control_keys.exits(job.key), replica_id)
    status = exit_status(exit_returncode(exit_info), event_name, reported=exit_info is not None)
    raw = client.hget(data_keys.replicas(job.key), replica_id)
    reported = json.loads(raw) if raw else {}
    fresh = time.time() - reported.get("updated", 0) < OWN_REPORT_FRESH_S
    if fresh and reported.get("state") in ("failed", "fenced") and reported.get("error"):
        if exit_info is None:
            status = "fenced" if reported["state"] == "fenced" else "query failed"
        status = f"{status}: {reported['error']}"
    tail = client.hget(control_keys.exit_tails(job.key), replica_id) or ""
    return status, f"{status}\n{tail}"


# The marks the controller takes itself (the others come from the replica that took over).
CONTROLLER_MARKS = ("fault", "detected", "decided", "commanded")


def taker_of(actions: list, stage: str) -> str:
    """The replica id that restores `stage`'s service in the state machine's `actions` (the
    promoted standby, the restarted replica), "" when none does."""
    for action in actions:
        if isinstance(action, PromoteStandby) and action.stage == stage:
            return action.replica_id
        if isinstance(action, RestartStage) and action.replica.stage == stage:
            return action.replica.replica_id
        if isinstance(action, ScheduleRestart) and action.stage == stage:
            return action.replica_id
        if isinstance(action, RestartJob):
            for spec in action.replicas:
                if spec.stage == stage and spec.role == "primary":
                    return spec.replica_id
    return ""


def mark_commanded(episode: RecoveryEpisode | None, at: float) -> None:
    """The recovery's commands were sent at `at` (epoch s): its `commanded` mark."""
    if episode is None:
        return
    episode.phases = {**episode.phases, "commanded": at}
    episode.save(update_fields=["phases"])


@transaction.atomic
def record_failure(
    job: Job, client, event, actions: list, launched_at: float, decided_at: float | None = None
) -> RecoveryEpisode | None:
    """A failure and the action taken: a ControlDecision pair and an open RecoveryEpisode,
    written together so nobody sees the decision without its episode. Returns the episode (None
    when none opens). `event.at` is the failure's detection, `decided_at` when the state
    machine answered it: the recovery's first controller marks (recovery_phases).

    Once per run of the replica (`launched_at`: when the failed process was asked for): a
    controller that died after recording a failure but before saving its supervision state is
    followed by one that sees the same failure again, acts again (harmless: every action is
    idempotent) and must not count a second failure and episode."""
    replica_id = event.replica_id
    run = f"{replica_id}@{launched_at:.3f}"
    if job.decisions.filter(
        kind=ControlDecision.Kind.FAILURE, replica_id=replica_id, detail__run=run
    ).exists():
        return None
    stored_id = Replica.full_id(job.key, replica_id)
    row = Replica.objects.filter(replica_id=stored_id).select_related("node").first()
    status, tail = failure_report(client, job, replica_id, type(event).__name__)
    stage = row.stage if row else ""
    node = row.node.name if row else ""
    decide(
        job,
        ControlDecision.Kind.FAILURE,
        f"{replica_id}: {status}",
        stage=stage,
        node=node,
        replica_id=replica_id,
        detail={"error_tail": tail, "event": repr(event), "run": run},
    )
    if row is not None:
        Replica.objects.filter(pk=row.pk).update(
            state=Replica.State.FAILED, ended_at=timezone.now()
        )
    action_kind, episode_action = decision_kinds(actions)
    if action_kind == ControlDecision.Kind.GIVE_UP:
        return None  # no recovery follows: apply_give_up (control/act.py) records the verdict
    decide(
        job,
        action_kind,
        describe_actions(actions),
        stage=stage,
        node=node,
        replica_id=replica_id,
    )
    if row is not None and row.role == Replica.Role.STANDBY and episode_action == "restart-stage":
        return None  # a lost standby costs no output: nothing to recover from
    phases = {"detected": float(event.at), "replica": taker_of(actions, stage)}
    if decided_at is not None:
        phases["decided"] = decided_at
    return RecoveryEpisode.objects.create(
        job=job,
        fault=FaultInjection.behind_failure(job, timezone.now()),
        strategy=job.strategy,
        stage=stage,
        action=episode_action,
        detected_at=timezone.now(),
        notes=f"{replica_id} on {node}: {type(event).__name__}",
        phases=phases,
    )


@transaction.atomic
def record_promotion_over_restart(job: Job, event: HeartbeatSeen, actions: list) -> None:
    """A standby caught up while its stage's primary was still restarting and takes over: the
    decision, and the stage's open restart episode now records a promotion. The restarted
    primary the machine gives up (killed next) is stopped in the same transaction: nobody
    sees the promotion while that replica's row still says it is the stage's primary."""
    stage = event.reported.get("stage", "")
    abandoned = [
        Replica.full_id(job.key, a.replica_id) for a in actions if isinstance(a, KillReplica)
    ]
    Replica.objects.filter(job=job, replica_id__in=abandoned).update(
        state=Replica.State.STOPPED, ended_at=timezone.now()
    )
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
        # The standby restores service now: the abandoned restart's marks are not this
        # recovery's (its catch-up ends when the standby took over).
        controller_marks = {k: v for k, v in episode.phases.items() if k in CONTROLLER_MARKS}
        episode.phases = {**controller_marks, "replica": event.replica_id}
        episode.save(update_fields=["action", "notes", "phases"])


def decision_kinds(actions: list) -> tuple[str, str]:
    """(decision kind, recovery episode action) for the state machine's answer to a failure."""
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


def record_reprotections(job: Job, supervisor: Supervisor) -> None:
    """Put each completed re-protection (promotion -> promotable standby again) on the promotion
    episode of that stage. Idempotent: an episode that has its figure keeps it."""
    for stage, promoted_at, protected_at in supervisor.reprotections:
        episode = (
            job.recoveries.filter(
                stage=stage,
                action=RecoveryEpisode.Action.PROMOTE,
                detected_at__lte=utc(promoted_at + 5),
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


def priority_fields(priority) -> dict:
    """The Operator columns an assessment of its priority sets (at launch and every cycle)."""
    return {
        "type_score": priority.S,
        "resource_score": priority.R,
        "dependency_score": priority.L,
        "priority": priority.P_eff,
        "mode": priority.mode,
        "predicted_fault_rate": priority.fr,
        "cpu_demand": priority.cpu,
        "mem_demand_mb": priority.mem,
        "demand_source": priority.demand_source,
    }


def store_assessment(job: Job, plan: JobPlan) -> None:
    """The launch's assessment of each operator: priority, stage and checkpoint interval."""
    stage_of = {op: stage.name for stage in plan.stages for op in stage.operators}
    for priority in plan.priorities:
        Operator.objects.filter(job=job, name=priority.name).update(
            **priority_fields(priority),
            # No stage of this run has a window of history yet; cycles replace it.
            fault_rate_source="prior (at launch)",
            stage=stage_of.get(priority.name, ""),
            checkpoint_interval_s=plan.intervals.get(priority.name, 0.0),
        )


def record_cycle(client, job: Job, duration_s: float) -> None:
    """When the job's last policy cycle ended and how long it took (read by /metrics)."""
    cycle = {"at": time.time(), "duration_s": round(duration_s, 4)}
    client.set(control_keys.controller_cycle(job.key), json.dumps(cycle), ex=3600)


# A job whose reconciles failed this many times in a row is alerted on: with the work queue's
# backoff (1 s doubling) that is about 15 s of failing, past any database or Redis blip.
RECONCILE_ALERT_FAILURES = 5
# A failure record outlives the controller that wrote it this long (its successor rewrites it
# within the backoff's cap while the job still fails, or deletes it when it no longer does).
RECONCILE_FAILURE_TTL_S = 600


def record_reconcile_failure(
    client, job: Job, failures: int, error: str, retry_in_s: float, controller: str
) -> dict:
    """Keep where the job page, the API and /metrics read it that the job's reconcile failed
    (`failures` in a row, the last with `error`, retried in `retry_in_s`), and ask for the
    alert once a streak reaches RECONCILE_ALERT_FAILURES. Returns the record."""
    key = control_keys.reconcile_failures(job.key)
    now = time.time()
    since = now
    if failures > 1:
        earlier = client.get(key)
        since = float(json.loads(earlier).get("since", now)) if earlier else now
    entry = {
        "failures": failures,
        "since": since,
        "at": now,
        "error": error[:500],
        "retry_in_s": retry_in_s,
        "controller": controller,
    }
    client.set(key, json.dumps(entry), ex=RECONCILE_FAILURE_TTL_S)
    if failures == RECONCILE_ALERT_FAILURES:
        # Named by when the streak began: one streak is emailed once per subscription.
        tasks.send(tasks.ALERT_RECONCILE_FAILING, job.pk, since, failures, entry["error"])
        alert_routing.raise_alert(
            reconcile_alert_key(job.key),
            "reconcile-failing",
            job=job,
            summary=f"{job.name}: {failures} reconciles in a row failed: {entry['error'][:120]}",
            details={"failures": failures, "since": since, "error": entry["error"]},
        )
    return entry


def reconcile_alert_key(job_key: str) -> str:
    """The alert of a job whose reconciles keep failing."""
    return f"reconcile-failing:{job_key}"


def clear_reconcile_failure(client, job_key: str) -> None:
    """The job's reconcile succeeded again: its failure record goes, and the alert of a streak
    long enough to have raised one resolves (the database is asked only then)."""
    if client.delete(control_keys.reconcile_failures(job_key)):
        alert_routing.clear_alert(reconcile_alert_key(job_key))


def reconcile_failures(client, job_keys: list[str]) -> dict[str, dict]:
    """job key -> its reconcile failure record (record_reconcile_failure), for the jobs whose
    reconciles fail now; one round trip."""
    if not job_keys:
        return {}
    raws = client.mget([control_keys.reconcile_failures(key) for key in job_keys])
    found = {}
    for key, raw in zip(job_keys, raws, strict=True):
        if raw is None:
            continue
        try:
            found[key] = json.loads(raw)
        except ValueError:
            log.warning("reconcile failure record of %s is not JSON, left out", key)
    return found


def recovery_alerts_wanted() -> bool:
    """Whether any enabled subscription asks for recovery-time alerts."""
    return ReportSubscription.objects.filter(
        enabled=True, alert_recovery_over_s__isnull=False
    ).exists()


def alert_slow_recoveries(job: Job, wanted: bool | None = None) -> None:
    """Ask for recovery-time alerts on the job's recent episodes (each is emailed at most once
    per subscription, so asking every cycle is safe; an open episode alerts while it lasts).
    `wanted`: recovery_alerts_wanted() as a controller read it for all its jobs (None: now)."""
    if not (recovery_alerts_wanted() if wanted is None else wanted):
        return
    since = timezone.now() - timezone.timedelta(minutes=15)
    for episode_id in job.recoveries.filter(detected_at__gte=since).values_list("pk", flat=True):
        tasks.send(tasks.ALERT_RECOVERY, episode_id)


def alert_failed_job(job: Job) -> None:
    """Email the subscriptions that asked to hear about jobs failing for good, and raise the
    job-failed alert (resolved by the first policy cycle of the job restarted)."""
    tasks.send(tasks.ALERT_JOB_FAILED, job.pk)
    # Keyed by the failure's time: a controller that records the same failure twice raises one
    # alert, and a job restarted and failed again pages again whatever the reopen throttle.
    failed_at = int(job.stopped_at.timestamp()) if job.stopped_at else 0
    alert_routing.raise_alert(
        f"job-failed:{job.key}:{failed_at}",
        "job-failed",
        job=job,
        summary=f"{job.name} failed: {(job.status_reason or 'no reason given')[:200]}",
        details={"reason": job.status_reason or ""},
    )


def watch_kafka(job: Job, client, config: PolicyConfig, primaries) -> list:
    """Every policy cycle of a job that reads Kafka: keep when each alerting condition began
    (control_keys.kafka_conditions; kafka_status.track) and ask for the alerts due: the
    source's cause set (broker down, topic missing), and the total lag of the stages'
    `primaries` (data-plane replica ids) over the policy's kafka_lag_alert_records at this
    cycle and the one before. Each alert names its condition by when it began, so the same
    condition is emailed once per subscription however many cycles ask. Returns the alerts
    due (sent only when some subscription asks for alerts)."""
    if not kafka_status.reads_kafka(job):
        return []
    conditions = control_keys.kafka_conditions(job.key)
    with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(data_keys.kafka_lag(job.key))
        pipe.hgetall(data_keys.stats(job.key))
        pipe.hgetall(conditions)
        entries, stats, seen = pipe.execute()
    lags = kafka_status.primary_lags(entries, primaries)
    current = kafka_status.conditions_now(
        kafka_status.source_cause(stats),
        kafka_status.total_lag(lags),
        config.kafka_lag_alert_records,
    )
    started = job.started_at.timestamp() if job.started_at else 0.0
    start, gone, due = kafka_status.track(seen, current, time.time(), not_before=started)
    if start or gone:
        with client.pipeline(transaction=False) as pipe:
            if start:
                pipe.hset(conditions, mapping=start)
            if gone:
                pipe.hdel(conditions, *gone)
            pipe.execute()
    if due and kafka_subscriptions(job).exists():
        for alert in due:
            detail = dict(alert.detail)
            if alert.kind == kafka_status.LAG:
                detail["stages"] = [
                    (f"{lag.stage} ({lag.replica})", _partition_lags(lag)) for lag in lags
                ]
            tasks.send(tasks.ALERT_KAFKA, job.pk, alert.kind, alert.since, detail)
    return due


# The events whose alerts watch_conditions owns: each cycle it raises those that hold and clears
# the job's other open ones. reconcile-failing is the fleet's (record_reconcile_failure).
WATCHED_EVENTS = (
    "job-failed",
    "job-unprotected",
    "output-stalled",
    "restarts",
    "checkpoint-failing",
    "checkpoint-slow",
    "kafka-lag",
    "kafka-source",
    "recovery-slow",
)


def supervision_conditions(
    job: Job, supervisor: Supervisor, config: PolicyConfig, now: float
) -> dict[str, dict]:
    """The conditions decided from the supervision state alone (a protected stage without its
    standby, failures over the count in the window): key -> {"event", "summary", "details"}.
    No I/O, so every reconcile can ask (raise_supervision_alerts)."""
    holding = {}

    def hold(key: str, event: str, summary: str, **details) -> None:
        holding[key] = {"event": event, "summary": summary, "details": details}

    protected = set(supervisor.active_stages)
    for stage, seconds in alert_conditions.unprotected_stages(
        supervisor.unprotected_since, protected, now, config.alert_unprotected_s
    ).items():
        hold(
            f"job-unprotected:{job.key}:{stage}",
            "job-unprotected",
            f"{job.name}: stage {stage} has run {seconds:.0f} s without its standby "
            f"(limit {config.alert_unprotected_s:g} s)",
            stage=stage,
            unprotected_s=round(seconds, 1),
            limit_s=config.alert_unprotected_s,
        )
    over = alert_conditions.restarts_over(
        [at for times in supervisor.failures.values() for at in times],
        now,
        config.alert_restarts_window_s,
        config.alert_restarts_count,
    )
    if over:
        hold(
            f"restarts:{job.key}",
            "restarts",
            f"{job.name}: {over} failures in {config.alert_restarts_window_s:g} s "
            f"(limit {config.alert_restarts_count})",
            failures=over,
            window_s=config.alert_restarts_window_s,
        )
    return holding


def raise_supervision_alerts(job: Job, supervisor: Supervisor, client, config: PolicyConfig):
    """Every reconcile (0.25 s while a job changes, 1 s once settled): raise at once the
    supervision-state conditions that hold and were not raised yet, rather than at the next
    policy cycle (up to cycle_interval_s later). Nothing holding: no I/O at all; holding and
    raised already: one Redis call. Clearing stays with the cycle (watch_conditions)."""
    return raise_fresh(job, client, supervision_conditions(job, supervisor, config, time.time()))


def raise_fresh(job: Job, client, holding: dict[str, dict]) -> list[str]:
    """Raise the conditions of `holding` (key -> {"event", "summary", "details"}) that were not
    raised yet (control_keys.job_alerts), and add them there; returns their keys. What was
    raised already is left to the cycle's watch_conditions (its count, its clearing), so a
    look between cycles writes to the database only when a condition is new."""
    if not holding:
        return []
    raised = control_keys.job_alerts(job.key)
    fresh = [key for key in holding if not client.sismember(raised, key)]
    for key in fresh:
        alert = holding[key]
        alert_routing.raise_alert(
            key, alert["event"], job=job, summary=alert["summary"], details=alert["details"]
        )
    if fresh:
        client.sadd(raised, *fresh)
        client.expire(raised, ACTIVITY_TTL_S)
    return fresh


def watch_conditions(
    job: Job,
    supervisor: Supervisor,
    client,
    config: PolicyConfig,
    progress: list,
    kafka_due: list,
    now: float | None = None,
    fresh_only: bool = False,
) -> dict[str, dict]:
    """Every policy cycle of a live job: decide each condition of docs/ALERTING.md from the
    numbers (console.policy.alert_conditions, the policy's thresholds), raise the alert of
    each that holds and clear the job's other open ones. `progress`: the progress records
    since the last look; `kafka_due`: watch_kafka's answer. `fresh_only` (the looks between
    cycles, console.services.controller.watch_between_cycles): raise only the conditions not
    raised yet (raise_fresh), unless this is the first look at a new run of the job. Returns
    key -> what holds."""
    now = time.time() if now is None else now
    holding = {}

    def hold(key: str, event: str, summary: str, **details) -> None:
        holding[key] = {"event": event, "summary": summary, "details": details}

    holding.update(supervision_conditions(job, supervisor, config, now))
    activity, new_run = _track_activity(client, job, progress, now)
    if alert_conditions.output_stalled(
        activity.get("output"), activity.get("input"), activity["watched"], now,
        config.alert_no_output_s,
    ):  # fmt: skip
        since = activity.get("output") or activity["watched"]
        hold(
            f"output-stalled:{job.key}",
            "output-stalled",
            f"{job.name}: no output for {now - since:.0f} s while input arrives "
            f"(limit {config.alert_no_output_s:g} s)",
            no_output_s=round(now - since, 1),
            limit_s=config.alert_no_output_s,
        )
    newest_batch_ms = {}
    for record in sorted(progress, key=lambda r: r.at):
        if record.is_primary and record.batch_ms is not None:
            newest_batch_ms[record.stage] = record.batch_ms
    for stage, seconds in alert_conditions.slow_batches(
        newest_batch_ms, config.alert_checkpoint_duration_s
    ).items():
        hold(
            f"checkpoint-slow:{job.key}:{stage}",
            "checkpoint-slow",
            f"{job.name}: stage {stage}'s batch and checkpoint took {seconds:.1f} s "
            f"(limit {config.alert_checkpoint_duration_s:g} s)",
            stage=stage,
            duration_s=round(seconds, 2),
        )
    for stage, error in alert_conditions.checkpoint_failures(_primary_errors(client, job)).items():
        hold(
            f"checkpoint-failing:{job.key}:{stage}",
            "checkpoint-failing",
            f"{job.name}: stage {stage}'s checkpoint failed: {error[:150]}",
            stage=stage,
            error=error[:500],
        )
    for alert in kafka_due:
        event = "kafka-lag" if alert.kind == kafka_status.LAG else "kafka-source"
        detail = {k: v for k, v in alert.detail.items() if k != "stages"}
        if alert.kind == kafka_status.LAG:
            summary = f"{job.name}: {detail['total']:,} records behind (limit {detail['limit']:,})"
        else:
            summary = f"{job.name}: Kafka source not reading: {detail.get('cause', '-')}"
        hold(f"{event}:{job.key}", event, summary, **detail)
    if config.alert_recovery_over_s:
        for episode in job.recoveries.filter(watched_s__isnull=True, recovery_time_s__isnull=True):
            elapsed = recovery_elapsed_s(episode, utc(now))
            if elapsed > config.alert_recovery_over_s:
                hold(
                    f"recovery-slow:{job.key}:{episode.pk}",
                    "recovery-slow",
                    f"{job.name}: still recovering after {elapsed:.0f} s "
                    f"(limit {config.alert_recovery_over_s:g} s; {episode.action})",
                    episode=episode.pk,
                    stage=episode.stage,
                    elapsed_s=round(elapsed, 1),
                )
    if fresh_only and not new_run:
        raise_fresh(job, client, holding)
        return holding
    # The keys raised at earlier cycles are kept in Redis, so a cycle with nothing open asks
    # the database nothing; a new run of the job also clears its job-failed alert.
    raised = control_keys.job_alerts(job.key)
    earlier = set(client.smembers(raised))
    if new_run:
        earlier |= set(
            Alert.objects.filter(
                job=job, state=Alert.State.OPEN, event__in=WATCHED_EVENTS
            ).values_list("key", flat=True)
        )
    for key, alert in holding.items():
        alert_routing.raise_alert(
            key, alert["event"], job=job, summary=alert["summary"], details=alert["details"]
        )
    gone = earlier - set(holding)
    for key in gone:
        alert_routing.clear_alert(key)
    if gone or set(holding) - earlier:
        with client.pipeline(transaction=False) as pipe:
            if gone:
                pipe.srem(raised, *gone)
            if holding:
                pipe.sadd(raised, *holding)
            pipe.expire(raised, ACTIVITY_TTL_S)
            pipe.execute()
    return holding


def clear_alerts_of_ended_job(job: Job, client) -> None:
    """A job that stopped or failed is no longer unprotected, stalled or lagging: clear the
    alerts watch_conditions raised for it (job-failed stays open until it runs again)."""
    raised = control_keys.job_alerts(job.key)
    for key in client.smembers(raised):
        if not key.startswith("job-failed:"):
            alert_routing.clear_alert(key)
    client.delete(raised)


def _track_activity(client, job: Job, progress: list, now: float) -> tuple[dict[str, float], bool]:
    """(the job's newest input and output times (keys.job_activity), moved on by this cycle's
    progress records, whether this is the first cycle watching this run of the job). Input
    is a primary's batch that read rows or, for a job on a Redis stream, the stream's newest
    entry; output a batch that wrote results; `watched`: when this run was first watched (no
    output yet counts from there)."""
    key = control_keys.job_activity(job.key)
    stored = {name: float(value) for name, value in client.hgetall(key).items()}
    started = job.started_at.timestamp() if job.started_at else now
    activity = dict(stored)
    new_run = activity.get("watched", 0.0) < started
    if new_run:
        # Not watched yet, or watched in an earlier run: count from now, not from the start
        # (a controller new to the job has not seen the output before it).
        activity = {"watched": now}
    inputs = [r.at for r in progress if r.is_primary and r.segment == "0" and r.input_rows > 0]
    arrived = _newest_input_at(client, job)
    if arrived is not None:
        inputs.append(arrived)
    outputs = [r.at for r in progress if r.is_output]
    if inputs:
        activity["input"] = max(activity.get("input", 0.0), *inputs)
    if outputs:
        activity["output"] = max(activity.get("output", 0.0), *outputs)
    if activity != stored:
        with client.pipeline(transaction=False) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=activity)
            pipe.expire(key, ACTIVITY_TTL_S)
            pipe.execute()
    return activity, new_run


# A job's activity record outlives a stopped job this long (a restart within it goes on).
ACTIVITY_TTL_S = 86_400


def _newest_input_at(client, job: Job) -> float | None:
    """When the newest entry reached the job's Redis input stream (an entry's id is the time
    it was added, in ms), so input that no batch reads (a stuck job) still counts as arriving;
    None for a Kafka job or an empty stream."""
    if kafka_status.reads_kafka(job):
        return None
    newest = client.xrevrange(data_keys.input_stream(job.key), "+", "-", count=1)
    if not newest:
        return None
    entry_id = newest[0][0]
    entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(entry_id.split("-")[0]) / 1000.0


def _primary_errors(client, job: Job) -> dict[str, str]:
    """stage -> the error its primary reported in its replica entry (a failed query)."""
    errors = {}
    for raw in client.hvals(data_keys.replicas(job.key)):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if entry.get("role") == "primary" and entry.get("state") == "failed" and entry.get("error"):
            errors[entry.get("stage", "")] = str(entry["error"])
    return errors


def _partition_lags(lag: kafka_status.ReplicaLag) -> str:
    """The lag of one primary for an alert: "1,200 records: partition 0 800 (read 100, end
    900), ..."."""
    parts = ", ".join(
        f"partition {p.partition} {p.lag:,} (read {p.read:,}, end {p.end:,})"
        for p in lag.partitions
    )
    return f"{lag.total:,} records: {parts}"


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
