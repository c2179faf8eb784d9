"""The soak's events (bench/soak/run.py says what a run does): each fault and restart of the
schedule fired, and judged until it recovered or was given up on, by the episodes the console
recorded, the job's output, or the service's answer. A side of Soak: it works on the run's jobs,
services and fault rows."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass

import redis
from django.contrib.auth.models import User
from django.db import connections

from bench.soak.schedule import (
    AGENT_RESTART,
    CONTROLLER_RESTART,
    JOB_FAULTS,
    KAFKA_BROKER,
    KAFKA_FAULTS,
    REDIS_RESTART,
    Event,
    event_rng,
    pick,
)
from bench.strategy.run import bench_user
from console.models import FaultInjection, Job, Node, RecoveryEpisode, Replica
from console.policy.recovery_phases import phase_seconds
from console.redis import redis_client
from console.services.demo_setup import DEMO_NODES
from console.services.faults import (
    FAULT_KINDS,
    FaultRefused,
    Target,
    kafka_bootstrap_of,
    request_fault,
)
from console.services.recovery import GIVE_UP_AFTER_S
from infra import keys as control_keys
from infra.kafka_outage import UP, outage
from spark_runtime.progress import read_progress
from spark_runtime.topology import SINK, SOURCE

DOWN_S = 3.0  # how long Redis and PostgreSQL stay down (docs/RELIABILITY.md's outage tests)
INJECT_TIMEOUT_S = 60.0  # for the controller to carry a requested fault out
EPISODE_GRACE_S = 30.0  # a fault with no episode this long after it opened none
# A fault's episode is judged by the console within its give-up time; a restart within 240 s.
EPISODE_TIMEOUT_S = GIVE_UP_AFTER_S + 60.0
JUDGE_TIMEOUT_S = 240.0
LIVE_REPLICA_STATES = (Replica.State.RUNNING, Replica.State.CATCHING_UP, Replica.State.SLOW)
SOAK_USER = "soak"


def soak_user() -> User:
    """The operator the run's jobs and faults are recorded under."""
    return bench_user(SOAK_USER)


@dataclass
class Pending:
    """What judging an event still needs."""

    row: dict
    since: float  # epoch s: the fault's injection, or when the service was back
    job: Job | None = None
    fault: FaultInjection | None = None
    stage: str = ""  # kill-standby: the stage whose standby was killed
    node: str = ""  # agent-restart: the node whose agent was killed
    output_at: float | None = None
    standby_at: float | None = None
    standby_lost: bool = False  # kill-standby: the stage was seen without a running standby
    back_at: float | None = None  # kafka-broker: when the broker answered again


def broker_back_at(job: Job, fault: FaultInjection) -> float | None:
    """When the broker a kafka-broker `fault` stopped answered again (epoch s), from its
    keeper's outage record; None while it is down (or the record is another fault's)."""
    bootstrap = kafka_bootstrap_of(job)
    if bootstrap is None:
        return None
    client = redis_client()
    try:
        record = outage(client, bootstrap)
    finally:
        client.close()
    if record is None or record.fault != fault.pk or record.state != UP:
        return None
    return record.back_at


def promotion_reprotect_s(episodes: list[RecoveryEpisode]) -> float | None:
    """Seconds until the last of a fault's promoted stages was protected again (a new standby
    caught up); None while one is not."""
    times = [e.reprotect_s for e in episodes if e.action == RecoveryEpisode.Action.PROMOTE]
    return None if None in times else max(times)


class FaultPlay:
    """How Soak fires and judges its events; Soak sets up the state these methods share."""

    def fire(self, event: Event) -> None:
        rng = event_rng(self.settings.seed, event.number)
        row = {
            "number": event.number,
            "kind": event.kind,
            "scheduled_at_s": event.at_s,
            "at_s": round(self.elapsed(), 1),
            "target": "",
            "injected": False,
            "detail": "",
            "recovered": None,
            "recovery_s": None,
            "how": "",
        }
        self.faults.append(row)
        if event.kind in JOB_FAULTS or event.kind in KAFKA_FAULTS:
            pending = self.fire_job_fault(row, rng)
        elif event.kind == CONTROLLER_RESTART:
            pending = self.restart_child(row, "controller")
        elif event.kind == AGENT_RESTART:
            node = pick(rng, DEMO_NODES)
            pending = self.restart_child(row, f"agent-{node}")
            pending.node = node
        elif event.kind == REDIS_RESTART:
            pending = self.restart_redis(row)
        else:
            pending = self.restart_postgres(row)
        self.say(f"{event.kind} on {row['target'] or '-'}: {row['detail']}")
        if pending is not None:
            self.pending.append(pending)

    def fire_job_fault(self, row: dict, rng) -> Pending | None:
        kind = row["kind"]
        entry = FAULT_KINDS[kind]
        candidates = {}
        for job in self.jobs:
            stages = dict(
                job.operators.exclude(kind__in=(SOURCE, SINK)).values_list("name", "stage")
            )
            live = Replica.objects.filter(job=job, state__in=LIVE_REPLICA_STATES)
            roles = set(live.values_list("stage", "role"))
            if entry.target is None:
                if job.source or job.sink:  # the broker of a job on Kafka
                    candidates[(job.name, "kafka")] = (job, "", None, "")
            elif entry.target == Target.OPERATOR:
                for operator, stage in stages.items():
                    if (stage, entry.role) in roles:
                        candidates[(job.name, operator)] = (job, operator, None, stage)
            else:
                for node in set(live.values_list("node__name", flat=True)):
                    candidates[(job.name, node)] = (job, "", node, "")
        choice = pick(rng, candidates)
        if choice is None:
            row["detail"] = "not injected: no target (no live replica it could hit)"
            return None
        job, operator, node_name, stage = candidates[choice]
        row["target"] = f"{job.name.rsplit('-', 1)[0]}/{operator or node_name or 'kafka'}"
        params = {}
        if kind == KAFKA_BROKER:
            params = {"duration_s": rng.choice((5, 10, 15))}
        elif kind == "pause-node":
            params = {"duration_s": rng.choice((2, 5, 8))}
        elif kind == "stress-node":
            params = {"duration_s": 10, "workers": rng.choice((1, 2))}
        try:
            fault = request_fault(
                job,
                kind,
                target_operator=operator,
                target_node=Node.objects.get(name=node_name) if node_name else None,
                params=params,
                requested_by=soak_user(),
            )
        except FaultRefused as exc:
            row["detail"] = f"not injected: refused: {exc}"
            return None
        # The controller carries it out; judge_job_fault waits for that (the loop goes on).
        row["detail"] = f"requested (params {params})" if params else "requested"
        return Pending(row, time.time(), job=job, fault=fault, stage=stage)

    def restart_child(self, row: dict, name: str) -> Pending:
        """SIGKILL a process of the cluster (its process group); the ProcessGroup starts it
        again, as a process manager would."""
        child = self.group.children[name]
        row["target"] = name
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.proc.pid, signal.SIGKILL)
        row["injected"] = True
        row["detail"] = f"SIGKILL to pid {child.proc.pid}; the launcher starts it again"
        return Pending(row, time.time())

    def restart_redis(self, row: dict) -> Pending:
        row["target"] = "redis"
        self.redis_server.crash()
        time.sleep(DOWN_S)
        self.redis_server.start()
        back = time.time()
        row["injected"] = True
        row["detail"] = f"SIGKILL, started again on its append-only file after {DOWN_S:g} s"
        return Pending(row, back)

    def restart_postgres(self, row: dict) -> Pending | None:
        row["target"] = "postgres"
        if self.postgres is None:
            row["detail"] = "skipped: no PostgreSQL of the run's own"
            return None
        self.postgres.crash()
        time.sleep(DOWN_S)
        self.postgres.start()
        back = time.time()
        connections.close_all()
        row["injected"] = True
        row["detail"] = f"pg_ctl stop -m immediate, started again after {DOWN_S:g} s"
        return Pending(row, back)

    def conclude(self, pending: Pending, recovered: bool, recovery_s, how: str) -> None:
        row = pending.row
        row["recovered"] = recovered
        row["recovery_s"] = None if recovery_s is None else round(recovery_s, 1)
        row["how"] = how
        verdict = f"recovered in {row['recovery_s']} s" if recovered else "NOT recovered"
        self.say(f"#{row['number']} {row['kind']} on {row['target']}: {verdict} ({how})")
        self.write()

    def give_up(self, pending: Pending, why: str) -> None:
        """Conclude an event not judged in time as not recovered, saying whether the job's
        output had come back meanwhile (a fault whose episode is still open)."""
        if pending.fault is not None and pending.row["injected"]:
            episodes = pending.fault.episodes.count()
            why += f"; {episodes} episode(s) still open" if episodes else "; no episode"
            if pending.output_at is None:
                with contextlib.suppress(redis.RedisError):
                    pending.output_at = self.first_output(pending.job, pending.since)
            if pending.output_at is not None:
                why += f"; output came back {pending.output_at - pending.since:.1f} s after it"
            else:
                why += "; no output since"
        self.conclude(pending, False, None, why)

    def standby_back_at(self, pending: Pending, now: float) -> float | None:
        """`now` if the stage of a kill-standby has a caught-up (running) standby again: a new
        one started after the fault, or the killed one restarted from its checkpoint (the same
        replica, so it is known by the stage having been seen without a running standby since
        the fault: a restart takes a JVM start and a catch-up, far longer than a poll)."""
        running = Replica.objects.filter(
            job=pending.job,
            stage=pending.stage,
            role=Replica.Role.STANDBY,
            state=Replica.State.RUNNING,
        )
        if not running.exists():
            pending.standby_lost = True
            return None
        if (
            pending.standby_lost
            or running.filter(started_at__gt=pending.fault.injected_at).exists()
        ):
            return now
        return None

    def unprotected_promotions(self) -> list[dict]:
        """The fault rows whose promotions had no new standby caught up when judged, their
        `reprotect_s` read again from their episodes."""
        waiting = []
        for row in self.faults:
            if "reprotect_s" not in row or row["reprotect_s"] is not None:
                continue
            pks = [phase["episode"] for phase in row["phases_s"]]
            row["reprotect_s"] = promotion_reprotect_s(
                list(RecoveryEpisode.objects.filter(pk__in=pks))
            )
            if row["reprotect_s"] is None:
                waiting.append(row)
        return waiting

    def first_output(self, job: Job, since: float) -> float | None:
        """When the job's final stage first wrote results after `since` (epoch s), or None."""
        client = redis_client()
        try:
            records = read_progress(client, job.key, since, count=2000)
        finally:
            client.close()
        outputs = [r.at for r in records if r.is_output and r.at > since]
        return outputs[0] if outputs else None

    def broker_away(self) -> bool:
        """Whether a kafka-broker fault of the schedule has not seen its broker answer again."""
        return any(p.row["kind"] == KAFKA_BROKER and p.back_at is None for p in self.pending)

    def judge_pending(self) -> None:
        still = []
        for pending in self.pending:
            if not self.judge(pending):
                limit = EPISODE_TIMEOUT_S if pending.fault else JUDGE_TIMEOUT_S
                if time.time() - pending.since > limit:
                    self.give_up(pending, f"not judged within {limit:g} s")
                else:
                    still.append(pending)
        self.pending = still

    def judge(self, pending: Pending) -> bool:
        """Whether the event is judged now (and if so, concluded)."""
        kind = pending.row["kind"]
        if kind in JOB_FAULTS or kind in KAFKA_FAULTS:
            return self.judge_job_fault(pending)
        client = redis_client()
        try:
            if kind == AGENT_RESTART:
                raw = client.get(control_keys.node_heartbeat(pending.node))
                at = json.loads(raw)["at"] if raw else 0.0
                if at >= pending.since:
                    self.conclude(pending, True, at - pending.since, "the agent heartbeats again")
                    return True
                return False
            # Supervision resumed: every job's policy cycle ran again after the service was back.
            cycles = client.mget([control_keys.controller_cycle(j.key) for j in self.jobs])
        finally:
            client.close()
        ats = [json.loads(raw)["at"] if raw else 0.0 for raw in cycles]
        if all(at > pending.since for at in ats):
            self.conclude(
                pending, True, max(ats) - pending.since, "every job's policy cycle ran again"
            )
            return True
        return False

    def judge_job_fault(self, pending: Pending) -> bool:
        fault, job, row = pending.fault, pending.job, pending.row
        if not row["injected"]:
            fault.refresh_from_db()
            if fault.outcome == FaultInjection.Outcome.PENDING:
                if time.time() - pending.since < INJECT_TIMEOUT_S:
                    return False
                row["detail"] += f"; not injected within {INJECT_TIMEOUT_S:g} s"
                self.say(f"#{row['number']} {row['kind']} on {row['target']}: {row['detail']}")
                return True
            row["detail"] = f"{fault.outcome}: {fault.outcome_detail}" + (
                f" (params {fault.params})" if fault.params else ""
            )
            self.say(f"#{row['number']} {row['kind']} on {row['target']}: {row['detail']}")
            if fault.outcome != FaultInjection.Outcome.INJECTED:
                return True  # refused or failed: not judged (recovered stays None)
            row["injected"] = True
            pending.since = fault.injected_at.timestamp()
            self.write()
        if row["kind"] == KAFKA_BROKER and pending.back_at is None:
            # Judged from when the broker answered again: until then the job cannot go on.
            pending.back_at = broker_back_at(job, fault)
            if pending.back_at is None:
                return False
            pending.since, pending.output_at = pending.back_at, None
            row["detail"] += f"; the broker answered again at {self.elapsed_at(pending.back_at)}"
        episodes = list(fault.episodes.all())
        if episodes:
            if any(e.watched_s is None for e in episodes):
                return False  # still being measured
            row["actions"] = sorted({e.action for e in episodes})
            actions = "+".join(row["actions"])
            # Where each episode's time went (console/policy/recovery_phases.py).
            row["phases_s"] = [
                {"episode": e.pk, "stage": e.stage, **phase_seconds(e.phases)} for e in episodes
            ]
            if RecoveryEpisode.Action.PROMOTE in row["actions"]:
                row["reprotect_s"] = promotion_reprotect_s(episodes)
            recovered = all(e.recovered_at is not None for e in episodes)
            times = [e.recovery_time_s for e in episodes if e.recovery_time_s is not None]
            self.conclude(
                pending,
                recovered,
                max(times) if times and recovered else None,
                f"{len(episodes)} episode(s), {actions}, closed"
                + (
                    ""
                    if recovered
                    else f" unrecovered after {max(e.watched_s for e in episodes)} s"
                ),
            )
            return True
        now = time.time()
        if pending.output_at is None:
            pending.output_at = self.first_output(job, pending.since)
        if pending.row["kind"] == "kill-standby" and pending.standby_at is None:
            pending.standby_at = self.standby_back_at(pending, now)
        if now - pending.since < EPISODE_GRACE_S:
            return False  # an episode may still be opened
        if pending.output_at is None:
            return False
        if pending.row["kind"] == "kill-standby":
            if pending.standby_at is None:
                return False
            self.conclude(
                pending,
                True,
                max(pending.output_at, pending.standby_at) - pending.since,
                "no episode; output went on and a new standby runs (seen then)",
            )
            return True
        after = "the broker answered again" if pending.back_at is not None else "the fault"
        self.conclude(
            pending,
            True,
            pending.output_at - pending.since,
            f"no episode; the first output after {after}",
        )
        return True
