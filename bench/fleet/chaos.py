"""The chaos run of the control plane (issue 58): controllers paused, the controller of a job
killed in the middle of its upgrade, operator requests (stop, rollback, confirm) arriving while
the controllers reconcile.

- `ControllerPauser` (`--pause-controllers N`): N times, a controller process chosen at random
  (seeded) is stopped with SIGSTOP, its whole process group, for 2-10 s (seeded), then let go
  on with SIGCONT. A pause longer than the 3 s lease hands its jobs to the others; when it
  wakes up, whatever it sends under its old tokens must be refused (the fence).
- `OperatorChaos` (`--kill-during-upgrade N`): N upgrades, each of a running `topn` job whose
  stages all run and which no fault hit in the last 30 s (as an operator would pick it), asked
  for through console.services.upgrades.request_upgrade as the API does (a new value of its
  `window_count` operator's `watermark_seconds`: the real state check, a SparkSession, then
  green started beside blue by the job's controller, spark_runtime/upgrade.py). When the
  upgrade's record reaches the phase chosen for it (`starting` for the even ones: green
  started, nothing switched; `validating` for the odd ones: green writes, blue stands by), the
  controller holding the job's lease is SIGKILLed, once another controller is live to take
  its jobs over (a disruption budget of one, as a PodDisruptionBudget keeps it: kills in quick
  succession would otherwise leave no controller while the replacements start, and a takeover
  would wait for a replacement's start), and a replacement started at once under its
  name (the count of controllers stays as asked, as a Deployment would keep it; the schedule's
  own controller kill is started again at once too in a chaos run). 0-4 s later
  the operator's request arrives, through console.services.upgrades.request_end: a rollback
  (even) or a confirm (odd). Beside them, one stop a 40 jobs (at least one) of a running job
  not being upgraded, through console.services.jobs.stop_job, spread over the window. The
  upgraded jobs are spared the schedule's process kills, so that an upgrade ends as its
  operator asked and not because its green was killed.

What counts (`OperatorChaos.figures`), read from the database and the simulator at the end,
after up to `settle_s` for the last requests to take effect:
- an operator request is `sent` when the service accepted it (a 409 is an answer, not a loss);
  it is `lost` when its effect never happened: a stopped job not `stopped`, or a process of it
  still running on a simulated node; a rollback whose upgrade was confirmed or is still under
  way; a confirm whose upgrade did not end confirmed;
- an upgrade is `started` when the service accepted it; `unfinished` when its record is still
  under way (requested, starting, switching, validating) at the end; `replaced_still_running`
  when the version it ended without (green after a rollback or an abandon, blue after a
  confirm) still has its process on a simulated node at the end (replica ids are not reused).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import redis
from django.db import DatabaseError, connection

from bench.fleet.measure import names_pid, use_database_in_this_thread
from bench.fleet.schedule import JOB_COOLDOWN_S, PlanThread
from console.models import Job, JobUpgrade
from console.services import jobs as job_service
from console.services import upgrades as upgrade_service
from console.services.fleet import CONTROLLER_ALIVE_S
from infra import keys as control_keys
from infra import leases
from spark_runtime.command_fence import holder_of

log = logging.getLogger(__name__)

PAUSE_S = (2.0, 10.0)
UPGRADE_TOPOLOGY = "topn"
UPGRADE_PARAM = "window_count.watermark_seconds"
KILL_PHASES = (JobUpgrade.Status.STARTING, JobUpgrade.Status.VALIDATING)
REQUEST_OF_PHASE = {
    JobUpgrade.Status.STARTING: upgrade_service.ROLLBACK,
    JobUpgrade.Status.VALIDATING: upgrade_service.CONFIRM,
}
PHASE_WAIT_S = 300.0  # the state check (a SparkSession on a busy machine) and green's start
REQUEST_DELAY_S = (0.0, 4.0)  # after the kill: before, during and after the takeover
JOBS_PER_STOP = 40
POLL_S = 0.2
# How long a kill in an upgrade waits for the job's holder and another live controller: a
# replacement's start (Celery and Django on a loaded machine) took 14 s.
KILL_WAIT_S = 60.0


@dataclass
class PauseRecord:
    """One controller pause: SIGSTOP at `at`, SIGCONT at `until`."""

    controller: str
    pid: int
    at: float
    planned_s: float
    until: float | None = None


def plan_pauses(duration_s: float, count: int, seed: int) -> list[tuple[float, float]]:
    """(offset into the window, length) of `count` pauses: one in each of `count` equal slots
    of the window's first 85 %, at a seeded point of the slot's first half, each 2-10 s."""
    rng = random.Random(seed + 3)
    slot = duration_s * 0.85 / max(1, count)
    return [
        (round(i * slot + rng.uniform(0, slot / 2), 2), round(rng.uniform(*PAUSE_S), 2))
        for i in range(count)
    ]


class ControllerPauser(PlanThread):
    """Carries out a pause plan in a thread, one pause at a time (a controller paused when
    `stop()` is called is let go on first). `fleet`: the run's Fleet (its `controllers()`
    names and `processes()` pids)."""

    thread_name = "fleet-pauses"

    def __init__(self, fleet, plan: list[tuple[float, float]], seed: int, say=None):
        super().__init__()
        self.fleet = fleet
        self.plan = plan
        self.rng = random.Random(seed + 4)
        self.say = say or (lambda _m: None)
        self.records: list[PauseRecord] = []

    def _run(self, start_at: float) -> None:
        for offset, length in self.plan:
            if self.stopping.wait(max(0.0, start_at + offset - time.time())):
                return
            names = self.fleet.controllers()
            if not names:
                continue
            name = self.rng.choice(names)
            pid = self.fleet.processes().get(name)
            if pid is None:
                continue
            try:
                os.killpg(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            record = PauseRecord(name, pid, time.time(), length)
            self.records.append(record)
            self.say(f"paused {name} (pid {pid}) for {length:g} s")
            self.stopping.wait(length)
            with contextlib.suppress(ProcessLookupError):  # killed while paused
                os.killpg(pid, signal.SIGCONT)
            record.until = time.time()


@dataclass
class UpgradeRecord:
    """One upgrade of the chaos run and what happened to it."""

    number: int
    kill_in: str  # the record's status at which its controller is killed
    request: str  # what the operator asks after the kill: rollback or confirm
    job: str = ""
    upgrade_id: int | None = None
    asked_at: float | None = None
    killed: str = ""
    killed_pid: int | None = None
    killed_at: float | None = None
    waited_for_another_s: float = 0.0  # the kill held back until another controller was live
    holders_before: dict = field(default_factory=dict)
    request_at: float | None = None
    request_sent: bool = False
    request_answer: str = ""  # the service's refusal (a 409), if any
    status: str = ""  # the record's status at the end
    outcome: str = ""
    replaced_running: str = ""  # the replica of the version it ended without, still running
    skipped: str = ""

    def entry(self) -> dict:
        """As fleet.json lists it (without the lease holders of every job)."""
        return {k: v for k, v in asdict(self).items() if k != "holders_before"}


@dataclass
class StopRecord:
    job: str
    at: float
    status: str = ""
    processes_left: int = 0


class OperatorChaos:
    """The upgrades killed in the middle and the operators' requests of a run (see the module
    docstring), each upgrade in a thread of its own from its planned offset."""

    def __init__(
        self,
        fleet,
        sim,
        faults,
        job_keys: list[str],
        user,
        duration_s: float,
        upgrades: int,
        seed: int,
        db_settings: dict,
        redis_url: str,
        say: Callable[[str], None] | None = None,
    ):
        self.fleet = fleet
        self.sim = sim
        self.faults = faults
        self.job_keys = job_keys
        self.user = user
        self.duration_s = duration_s
        self.rng = random.Random(seed + 5)
        self.db_settings = db_settings
        self.redis_url = redis_url
        self.say = say or (lambda _m: None)
        self.upgrades = [
            UpgradeRecord(i, KILL_PHASES[i % 2], REQUEST_OF_PHASE[KILL_PHASES[i % 2]])
            for i in range(upgrades)
        ]
        self.stops: list[StopRecord] = []
        self.stop_count = max(1, len(job_keys) // JOBS_PER_STOP)
        self.taken: set[str] = set()  # jobs upgraded or stopped: each is used once
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    # --- running ------------------------------------------------------------------------------

    def start(self, start_at: float) -> None:
        """Upgrades from 10 % of the window on, spread over its first half; stops spread over
        its first 80 %."""
        count = len(self.upgrades)
        for record in self.upgrades:
            offset = self.duration_s * (0.1 + 0.4 * record.number / max(1, count))
            self._thread(f"fleet-upgrade-{record.number}", self._upgrade, record, start_at + offset)
        offsets = [
            self.duration_s * 0.8 * (i + self.rng.random()) / self.stop_count
            for i in range(self.stop_count)
        ]
        self._thread("fleet-stops", self._stops, [start_at + o for o in offsets])

    def _thread(self, name: str, target, *args) -> None:
        def run():
            use_database_in_this_thread(self.db_settings)
            try:
                target(*args)
            except (DatabaseError, redis.RedisError) as exc:
                self.errors.append(f"{name}: {type(exc).__name__}: {exc}")
                log.warning("%s: %s", name, exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def _pick(self, candidates: list[str]) -> Job | None:
        """A running job of `candidates` not used yet (taken for this use)."""
        with self.lock:
            free = sorted(set(candidates) - self.taken)
            return self._take(free)

    def _pick_healthy(self, candidates: list[str]) -> Job | None:
        """As `_pick`, among jobs an operator would upgrade: every stage process running a
        batch at least, and no fault of the schedule in the last JOB_COOLDOWN_S (a job whose
        primary is being replaced is refused: "no running primary to upgrade from")."""
        now = time.time()
        with self.lock:
            free = sorted(
                key
                for key in set(candidates) - self.taken
                if now - self.faults.last_hit.get(key, -math.inf) >= JOB_COOLDOWN_S
                and self._all_running(key)
            )
            return self._take(free)

    def _all_running(self, job: str) -> bool:
        stages = [p for p in self.sim.processes_of(job) if not p.generator]
        return bool(stages) and all(p.state == "running" and p.batches > 0 for p in stages)

    def _take(self, free: list[str]) -> Job | None:
        """One running job of `free`, chosen at random, taken (call with the lock held)."""
        running = set(
            Job.objects.filter(key__in=free, status=Job.Status.RUNNING).values_list(
                "key", flat=True
            )
        )
        choices = [k for k in free if k in running]
        if not choices:
            return None
        key = self.rng.choice(choices)
        self.taken.add(key)
        return Job.objects.get(key=key)

    def _stops(self, times: list[float]) -> None:
        for at in times:
            if self.stopping.wait(max(0.0, at - time.time())):
                return
            job = self._pick(self.job_keys)
            if job is None:
                continue
            job_service.stop_job(job, f"stopped by {self.user.username} (fleet_sim chaos)")
            self.stops.append(StopRecord(job.key, time.time()))
            self.say(f"asked {job.key} to stop")

    def _upgrade(self, record: UpgradeRecord, at: float) -> None:
        if self.stopping.wait(max(0.0, at - time.time())):
            return
        topn = list(
            Job.objects.filter(key__in=self.job_keys, topology=UPGRADE_TOPOLOGY).values_list(
                "key", flat=True
            )
        )
        job = self._pick_healthy(topn)
        if job is None:
            record.skipped = f"no {UPGRADE_TOPOLOGY} job left with every stage running"
            return
        record.job = job.key
        # Spared the process kills: the upgrade ends as its operator asks, not by a fault.
        self.faults.spare(job.key)
        try:
            upgrade = upgrade_service.request_upgrade(
                job, params={UPGRADE_PARAM: str(31 + record.number)}, user=self.user
            )
        except upgrade_service.UpgradeRequestError as exc:
            record.skipped = f"the upgrade was refused: {exc}"
            return
        record.upgrade_id, record.asked_at = upgrade.pk, time.time()
        self.say(f"upgrade {upgrade.pk} of {job.key} asked for")
        status = self._wait_for_phase(upgrade.pk, record.kill_in)
        if status != record.kill_in:
            record.skipped = f"not killed: the upgrade was {status}, never {record.kill_in}"
            return
        if not self._kill_holder(record):
            return
        time.sleep(self.rng.uniform(*REQUEST_DELAY_S))
        record.request_at = time.time()
        try:
            upgrade_service.request_end(upgrade, record.request, self.user)
            record.request_sent = True
            self.say(f"{record.request} of upgrade {upgrade.pk} asked for")
        except upgrade_service.UpgradeRequestError as exc:
            record.request_answer = str(exc)

    def _wait_for_phase(self, upgrade_id: int, phase: str) -> str:
        """The record's status once it is `phase`, or has ended, or after PHASE_WAIT_S."""
        deadline = time.time() + PHASE_WAIT_S
        status = ""
        while time.time() < deadline and not self.stopping.is_set():
            status = JobUpgrade.objects.values_list("status", flat=True).get(pk=upgrade_id)
            if status == phase or status not in JobUpgrade.UNDER_WAY:
                return status
            time.sleep(POLL_S)
        return status

    def _kill_holder(self, record: UpgradeRecord) -> bool:
        """SIGKILL the controller holding the job's lease, once another controller of the fleet
        is live, and start a replacement under its name; False when no controller of the fleet
        held it, with another live, within KILL_WAIT_S."""
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        started = time.time()
        while time.time() < started + KILL_WAIT_S:
            owner = holder_of(client.get(control_keys.controller_lease(record.job)))
            live = leases.live_controllers(client, CONTROLLER_ALIVE_S)
            controllers = {
                n: pid for n, pid in self.fleet.processes().items() if n.startswith("controller")
            }
            name = next((n for n, pid in controllers.items() if names_pid(owner, pid)), None)
            another_live = any(
                names_pid(o, pid) for n, pid in controllers.items() if n != name for o in live
            )
            if name is not None and another_live:
                values = client.mget([control_keys.controller_lease(k) for k in self.job_keys])
                record.holders_before = {
                    k: holder_of(v) for k, v in zip(self.job_keys, values, strict=True)
                }
                record.killed, record.killed_pid = name, controllers[name]
                record.killed_at = time.time()
                record.waited_for_another_s = round(record.killed_at - started, 2)
                self.fleet.group.kill(name)
                self.fleet.restart(name)
                self.say(
                    f"SIGKILLed {name} (pid {record.killed_pid}) holding {record.job} in its "
                    f"upgrade's {record.kill_in} phase; started a replacement"
                )
                return True
            time.sleep(POLL_S)
        record.skipped = (
            f"for {KILL_WAIT_S:g} s, no controller held the job's lease with another one live"
        )
        return False

    # --- the end --------------------------------------------------------------------------------

    def settle(self, timeout_s: float) -> float:
        """Wait (at most `timeout_s`) until every upgrade has ended and every stop took effect;
        returns how long it took."""
        started = time.time()
        for thread in self.threads:
            thread.join(max(0.0, started + timeout_s - time.time()))
        while time.time() < started + timeout_s and self._pending():
            time.sleep(1.0)
        return time.time() - started

    def _pending(self) -> bool:
        ids = [r.upgrade_id for r in self.upgrades if r.upgrade_id is not None]
        if JobUpgrade.objects.filter(pk__in=ids, status__in=JobUpgrade.UNDER_WAY).exists():
            return True
        stopped = [s.job for s in self.stops]
        if Job.objects.filter(key__in=stopped).exclude(status=Job.Status.STOPPED).exists():
            return True
        return any(self.sim.processes_of(key) for key in stopped)

    def figures(self) -> tuple[dict, dict]:
        """(operator_requests, upgrades) as fleet.json has them, read now."""
        lost = []
        for stop in self.stops:
            stop.status = Job.objects.values_list("status", flat=True).get(key=stop.job)
            stop.processes_left = len(self.sim.processes_of(stop.job))
            if stop.status != Job.Status.STOPPED or stop.processes_left:
                lost.append(f"stop of {stop.job}: {stop.status}, {stop.processes_left} processes")
        for record in self.upgrades:
            if record.upgrade_id is None:
                continue
            upgrade = JobUpgrade.objects.get(pk=record.upgrade_id)
            record.status, record.outcome = upgrade.status, upgrade.outcome
            replaced = {
                JobUpgrade.Status.CONFIRMED: upgrade.blue_replica,
                JobUpgrade.Status.ROLLED_BACK: upgrade.green_replica,
                JobUpgrade.Status.ABANDONED: upgrade.green_replica,
            }.get(upgrade.status, "")
            running = {p.replica_id for p in self.sim.processes_of(record.job)}
            if replaced and replaced in running:
                record.replaced_running = replaced
            if not record.request_sent:
                continue
            # A rollback's effect: the old version writes and the new one is gone (rolled back,
            # or abandoned by the takeover before it switched); a confirm's: the new one stays.
            wanted = (
                (JobUpgrade.Status.ROLLED_BACK, JobUpgrade.Status.ABANDONED)
                if record.request == upgrade_service.ROLLBACK
                else (JobUpgrade.Status.CONFIRMED,)
            )
            done = upgrade.status in wanted
            if not done:
                lost.append(f"{record.request} of upgrade {upgrade.pk}: {upgrade.status}")
        sent = len(self.stops) + sum(1 for r in self.upgrades if r.request_sent)
        requests = {
            "sent": sent,
            "lost": len(lost),
            "lost_examples": lost[:5],
            "stops": [asdict(s) for s in self.stops],
            "errors": self.errors[:5],
        }
        started = [r for r in self.upgrades if r.upgrade_id is not None]
        upgrades = {
            "started": len(started),
            "unfinished": sum(1 for r in started if r.status in JobUpgrade.UNDER_WAY),
            "killed_in_the_middle": sum(1 for r in started if r.killed_at is not None),
            "replaced_still_running": sum(1 for r in started if r.replaced_running),
            "by_status": _count(r.status for r in started),
            "log": [r.entry() for r in self.upgrades],
        }
        return requests, upgrades


def _count(values) -> dict:
    out: dict[str, int] = {}
    for value in values:
        out[str(value)] = out.get(str(value), 0) + 1
    return dict(sorted(out.items()))
