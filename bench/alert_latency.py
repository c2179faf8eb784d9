"""How soon an alert reaches its receiver on a live console: from a condition becoming true to
the receiver's HTTP request (issue 61's goal: p99 at most 5 s with the demo running).

Run beside a console whose controller, agents and alerts worker are up (the demo), in the same
settings (database, Redis): `manage.py alert_latency`. It adds a webhook route to a receiver on
loopback (bench.receivers), sets low thresholds through a new, audited policy version, injects
faults into the live job through the same service as the API, and for each alert that arrives
works out when its condition became true:

- `job-unprotected` (kill-driver: the standby is promoted, the stage runs without one until
  a new one caught up): the alert's details say how long at the raise (`unprotected_s`); the
  condition held from `limit` on;
- `output-stalled` (slow-driver: batches late, heartbeats on): `no_output_s` past the limit;
- `checkpoint-slow` (the same fault): the first progress record of a batch over the bound, at
  the time its stage published it (its Redis stream entry id);
- `recovery-slow` (the same fault): `elapsed_s` past the limit, counted from the fault.

The previous thresholds are restored (another audited version) and the route deleted at the
end, however the run ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from console.models import AlertRoute, FaultInjection, Job, RecoveryEpisode, Replica
from console.services import faults
from console.services.policy import change_policy, policy_in_force
from spark_runtime import keys as data_keys
from spark_runtime.progress import ProgressRecord, percentiles

from .receivers import Received, Receiver

log = logging.getLogger(__name__)

ROUTE_NAME = "alert-latency-benchmark"
REASON = "alert latency benchmark (manage.py alert_latency)"
# Low thresholds, so each fault makes its condition true within seconds; a reopen throttle of
# 0 so the same condition pages again at the next round.
THRESHOLDS = {
    "alert_unprotected_s": 3.0,
    "alert_no_output_s": 2.0,
    "alert_checkpoint_duration_s": 3.0,
    "alert_recovery_over_s": 1.0,
    "alert_reopen_throttle_s": 0.0,
}
SLOW_DELAY_S, SLOW_FOR_S = 6.0, 20.0
ARRIVAL_TIMEOUT_S = 120.0
SETTLE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Scenario:
    """A fault (aimed at a stage with a standby) and the events it makes true."""

    fault: str
    events: tuple[str, ...]
    params: dict


SCENARIOS = (
    Scenario("kill-driver", ("job-unprotected", "recovery-slow"), {}),
    Scenario(
        "slow-driver",
        ("output-stalled", "checkpoint-slow"),
        {"delay_s": SLOW_DELAY_S, "duration_s": SLOW_FOR_S},
    ),
)
EVENTS = tuple(event for scenario in SCENARIOS for event in scenario.events)


@dataclass(frozen=True)
class Measured:
    """One alert: when its condition became true, when the receiver heard it."""

    event: str
    round: int
    true_at: float
    opened_at: float
    received_at: float

    @property
    def latency_s(self) -> float:
        return self.received_at - self.true_at

    @property
    def detection_s(self) -> float:
        return self.opened_at - self.true_at


def held_past_limit(payload: dict, field: str, limit_s: float) -> float:
    """When a condition measured at the raise (`details[field]` seconds held) became true."""
    return payload["opened_at"] - (float(payload["details"][field]) - limit_s)


def first_slow_batch_at(client, job_key: str, stage: str, since: float, bound_s: float):
    """When the stage's primary first published a batch over `bound_s` after `since` (its
    progress stream entry's id, in ms), or None."""
    start = f"{int(since * 1000)}-0"
    for entry_id, fields in client.xrange(data_keys.progress(job_key), min=start):
        record = ProgressRecord.from_fields(fields)
        if record.stage == stage and record.is_primary and (record.batch_ms or 0) > bound_s * 1000:
            return int(str(entry_id).split("-")[0]) / 1000.0
    return None


def output_stage(client, job_key: str) -> str | None:
    """The stage whose primary wrote the job's output in its newest progress records."""
    for _entry_id, fields in client.xrevrange(data_keys.progress(job_key), count=200):
        record = ProgressRecord.from_fields(fields)
        if record.is_primary and record.is_output:
            return record.stage
    return None


def summarize(measured: list[Measured]) -> dict:
    """Per event and over all: count, p50/p99/max of the latency and of its detection part."""

    def block(items):
        latencies = [m.latency_s for m in items]
        return {
            "count": len(items),
            "latency_s": {**percentiles(latencies), "max": max(latencies, default=None)},
            "detection_s": percentiles([m.detection_s for m in items]),
        }

    by_event = {event: [m for m in measured if m.event == event] for event in EVENTS}
    return {
        "events": {event: block(items) for event, items in by_event.items() if items},
        "all": block(measured),
    }


def render(summary: dict, command: str, when: str, load: str) -> str:
    """The Markdown of docs/RESULTS.md's subsection."""
    lines = [
        f"Measured {when} with the demo running (its controller, agents, alerts worker and "
        f"live job); load average at the start {load}. Command:",
        "",
        f"    {command}",
        "",
        "| event | alerts | latency p50 | p99 | max | detection p50 | p99 |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(name, block):
        lat, det = block["latency_s"], block["detection_s"]
        return (
            f"| {name} | {block['count']} | {lat['p50']:.2f} s | {lat['p99']:.2f} s | "
            f"{lat['max']:.2f} s | {det['p50']:.2f} s | {det['p99']:.2f} s |"
        )

    for event, block in summary["events"].items():
        lines.append(row(f"`{event}`", block))
    lines.append(row("all", summary["all"]))
    missed = summary.get("missed") or []
    if missed:
        names = ", ".join(f"{m['event']} (round {m['round']})" for m in missed)
        lines += ["", f"No alert within {ARRIVAL_TIMEOUT_S:.0f} s (not true long enough): {names}."]
    return "\n".join(lines)


class AlertLatencyRun:
    """One run against `job` (a running job with standbys): `rounds` of every scenario."""

    def __init__(self, job: Job, client, rounds: int, say: Callable[[str], None]):
        self.job, self.client, self.rounds, self.say = job, client, rounds, say
        self.receiver = Receiver()
        self.route: AlertRoute | None = None
        self.previous: dict | None = None
        self.measured: list[Measured] = []
        self.missed: list[tuple[str, int]] = []  # (event, round) with no alert

    def run(self) -> list[Measured]:
        self.receiver.start()
        try:
            self._set_up()
            for round_ in range(1, self.rounds + 1):
                for scenario in SCENARIOS:
                    self._settle()
                    self._one(scenario, round_)
        finally:
            self._tear_down()
            self.receiver.stop()
        return self.measured

    def _set_up(self) -> None:
        policy = policy_in_force()
        self.previous = {name: getattr(policy, name) for name in THRESHOLDS}
        change_policy(THRESHOLDS, reason=REASON)
        self.route = AlertRoute.objects.create(
            name=ROUTE_NAME,
            channel=AlertRoute.Channel.WEBHOOK,
            target=self.receiver.url,
            events=list(EVENTS),
            min_severity="info",
        )
        self.say(f"route {ROUTE_NAME} -> {self.receiver.url}; thresholds {THRESHOLDS}")

    def _tear_down(self) -> None:
        if self.route is not None:
            self.route.delete()
        if self.previous is not None:
            change_policy(self.previous, reason=f"{REASON}: thresholds restored")
            self.say("thresholds restored")

    def _settle(self) -> None:
        """Wait until the job runs protected: every stage's primary and standby running, no
        recovery open."""
        deadline = time.time() + SETTLE_TIMEOUT_S
        while time.time() < deadline:
            self.job.refresh_from_db()
            if self.job.status != Job.Status.RUNNING:
                raise RuntimeError(f"job {self.job.name} is {self.job.status}")
            running = Replica.objects.filter(job=self.job, state=Replica.State.RUNNING)
            roles = set(running.values_list("role", "stage"))
            standbys = {stage for role, stage in roles if role == Replica.Role.STANDBY}
            primaries = {stage for role, stage in roles if role == Replica.Role.PRIMARY}
            open_recovery = RecoveryEpisode.objects.filter(job=self.job, watched_s__isnull=True)
            if standbys and standbys <= primaries and not open_recovery.exists():
                time.sleep(5)  # past the previous round's resolves
                return
            time.sleep(1)
        raise RuntimeError(f"job {self.job.name} not protected within {SETTLE_TIMEOUT_S:.0f} s")

    def _target(self, scenario: Scenario) -> tuple[str, str]:
        """(operator, stage) the fault is aimed at: a stage with a running standby, the one
        that writes the job's output for a slow-driver (slowing a stage before it would stall
        the input too: a Kafka job's input is seen through its first stage's batches)."""
        standbys = Replica.objects.filter(
            job=self.job, role=Replica.Role.STANDBY, state=Replica.State.RUNNING
        ).values_list("stage", flat=True)
        stage = output_stage(self.client, self.job.key) if scenario.fault == "slow-driver" else None
        stage = stage or standbys.first()
        operator = self.job.operators.filter(stage=stage).values_list("name", flat=True).first()
        if operator is None:
            raise RuntimeError(f"job {self.job.name} has no protected operator to aim at")
        return operator, stage

    def _one(self, scenario: Scenario, round_: int) -> None:
        operator, stage = self._target(scenario)
        heard_before = len(self.receiver.requests)
        injected_at = time.time()
        fault = faults.request_fault(
            self.job, scenario.fault, target_operator=operator, params=scenario.params
        )
        self.say(f"round {round_}: {scenario.fault} on {operator} (fault {fault.pk})")
        for event in scenario.events:
            request = self._arrival(event, heard_before)
            if request is None:  # the condition never held long enough (a quick re-protect)
                self.say(f"  {event}: no alert within {ARRIVAL_TIMEOUT_S:.0f} s")
                self.missed.append((event, round_))
                continue
            payload = request.json()
            true_at = self._true_at(event, payload, stage, injected_at)
            measured = Measured(event, round_, true_at, payload["opened_at"], request.at)
            self.measured.append(measured)
            self.say(
                f"  {event}: {measured.latency_s:.2f} s from true to the request "
                f"(detection {measured.detection_s:.2f} s)"
            )
        self._wait_fault_done(fault)

    def _arrival(self, event: str, after: int) -> Received | None:
        """The first trigger of `event` the receiver heard after its `after` first requests,
        or None after ARRIVAL_TIMEOUT_S."""
        deadline = time.time() + ARRIVAL_TIMEOUT_S
        while time.time() < deadline:
            for request in self.receiver.requests[after:]:
                payload = request.json()
                if payload["event"] == event and payload["action"] == "trigger":
                    return request
            time.sleep(0.1)
        return None

    def _true_at(self, event: str, payload: dict, stage: str, injected_at: float) -> float:
        if event == "job-unprotected":
            return held_past_limit(payload, "unprotected_s", THRESHOLDS["alert_unprotected_s"])
        if event == "output-stalled":
            return held_past_limit(payload, "no_output_s", THRESHOLDS["alert_no_output_s"])
        if event == "recovery-slow":
            return held_past_limit(payload, "elapsed_s", THRESHOLDS["alert_recovery_over_s"])
        slow_at = first_slow_batch_at(
            self.client, self.job.key, stage, injected_at, THRESHOLDS["alert_checkpoint_duration_s"]
        )
        if slow_at is None:
            raise RuntimeError(f"{event} alerted but no slow batch was published")
        return slow_at

    def _wait_fault_done(self, fault: FaultInjection) -> None:
        """A slow-driver lasts its duration: the next round starts after it."""
        if fault.kind == FaultInjection.Kind.SLOW_DRIVER:
            time.sleep(max(0.0, fault.requested_at.timestamp() + SLOW_FOR_S - time.time()))


def when_text(at: float) -> str:
    return datetime.fromtimestamp(at).astimezone().strftime("%Y-%m-%d %H:%M %Z")
