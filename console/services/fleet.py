"""Supervision of a fleet: each controller process reconciles many jobs from one work queue.

Kubernetes' controller-runtime is the model: a reconcile is a function of one job's key, fed by
a delaying work queue (infra/workqueue.py) to a small, fixed number of worker threads; no job
holds a thread. A job is queued again on its own period (FAST_PERIOD_S while something is
changing, STEADY_PERIOD_S once every replica runs and every stage is protected), and at once,
ahead of any backlog of periodic reconciles, when a node agent reports something about it (an
exit, a refused or carried-out fault) on the agent events stream, which one thread per process
reads for all its jobs.

Jobs are spread over the live controller processes by per-job leases in Redis
(infra/leases.py): every RENEW_S a thread of its own renews them all in one round trip (so
taking hundreds of jobs over never delays it past a lease), and the membership thread reads the
live jobs in one query and takes unleased jobs up to its fair share (live jobs / live
controllers, rounded up), preferring the jobs that rendezvous hashing gives it so controllers
rarely compete for one; a controller over its share gives the surplus up while another is
below its own (one joined) to take it. A dead or stalled controller's leases expire after
LEASE_S, and the others take those jobs at their next renewal, over their share too (a lease
that ran out is told from a released one and from a new job's, `leases.expired`); so is any job
left free for FREE_WAIT_S (handed to a controller that did not take it).
The supervision state is written only while the lease is ours (a compare-and-set on it), so a
controller that stalled past its lease cannot act on a job twice. The same thread reads what is
the same for every job once per renewal (`FleetView`: policy in force, alive nodes, their recent
samples and Q ranking, warm spares), instead of once per job, and which of its jobs have an
upgrade under way in the database (each one's reconcile then looks at it: an upgrade never
depends on a wake-up, which a controller that dies consumes with it).

Every reconcile is the controller's tick (console.services.controller.supervise_tick) and, when
due, its policy cycle: each side effect idempotent and the state saved after each, so a process
killed between two steps loses nothing.

Failures. A reconcile that raises is retried with a per-job exponential delay (infra/workqueue.py
`FailureBackoff`, as controller-runtime's rate-limited requeue), so one job that keeps failing
neither spins nor holds the others up; it is recorded where the job page, the API and /metrics
read it, and alerted on (console.services.control.record). A job deleted from the database while
live has its replicas killed, its control-plane keys deleted and its lease released, once.
A membership round that raises is logged and counted, and the next one runs; one malformed
entry (a node's heartbeat, a warm spare, a job's state written by a newer controller) is left
out of the view rather than failing it. Leases are renewed only while every thread of the
controller runs: a thread that ends anyway makes the controller give every job up and leave the
membership, since a controller that renews leases it no longer supervises (its view frozen, stop
requests unseen, counted in the fair share) is worse than one that is gone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import redis
from django.db import DatabaseError, connection

from console.models import Job, JobUpgrade, Policy, PredictorTraining
from console.policy.config import PolicyConfig
from console.redis import redis_client
from console.services import controller
from console.services.control.act import stop_deleted_job
from console.services.control.fence import LeaseLost, acting_under
from console.services.control.observe import (
    alive_nodes,
    load_supervisor,
    node_history,
    spares_by_state,
)
from console.services.control.record import (
    clear_reconcile_failure,
    record_reconcile_failure,
    recovery_alerts_wanted,
)
from console.services.planning import rank_nodes
from console.services.prediction import latest_training
from infra import keys as control_keys
from infra import leases
from infra.workqueue import FailureBackoff, WorkQueue
from spark_runtime.supervision import Supervisor

log = logging.getLogger(__name__)

LEASE_S = 3.0  # a dead controller's jobs wait at most this long (plus a renewal) for another
RENEW_S = 1.0  # leases renewed, live jobs read, fair shares settled this often
# A controller counts as alive while it said so within this (three missed renewals).
CONTROLLER_ALIVE_S = 3 * RENEW_S
FAST_PERIOD_S = 0.25  # a job whose replicas are starting, failing over or backing off
STEADY_PERIOD_S = 1.0  # a settled job: agents' exit reports wake it at once anyway
EVENTS_BLOCK_MS = 1000
ERROR_RETRY_S = 1.0  # agent events unreadable: read again after this
# A reconcile that met a database or Redis error backs off no longer than this: such errors are
# the fleet's, not the job's (an outage, a failover), and every job must be back soon after.
TRANSIENT_RETRY_CAP_S = 5.0
# How long an abdicating controller waits for its reconciles under way before it gives up.
ABDICATE_WAIT_S = 5.0
# A job seen free this long (given up to a controller below its share that has not taken it: a
# replacement still starting, one paused) is taken by any controller, over its share too.
FREE_WAIT_S = 2 * RENEW_S
# How long a controller's published figures (keys.controller_stats) outlive its last renewal.
STATS_TTL_S = 10 * CONTROLLER_ALIVE_S


@dataclass
class FleetView:
    """What every job's reconcile reads alike in one renewal, read once for all of them."""

    config: PolicyConfig
    alive: dict[str, dict]
    history: dict
    ranked: list[str]
    spares: dict[str, Counter]
    latest_model: PredictorTraining | None  # the fault predictor's training run in force
    recovery_alerts: bool  # whether any subscription asks for recovery-time alerts
    at: float = field(default_factory=time.time)


def read_fleet_view(client) -> FleetView:
    """The policy in force, the alive nodes with their recent samples, ranked by Q, their warm
    spares by state, the fault predictor in force, and whether recovery alerts are wanted."""
    config = Policy.current().to_config()
    alive = alive_nodes(client)
    history = node_history(client, alive)
    ranked = rank_nodes(history, config)
    return FleetView(
        config,
        alive,
        history,
        ranked,
        spares_by_state(client, ranked),
        latest_model=latest_training(),
        recovery_alerts=recovery_alerts_wanted(),
    )


@dataclass
class JobSlot:
    """A job this controller holds the lease of, with its supervisor kept in memory."""

    job: Job
    supervisor: Supervisor | None
    next_cycle: float = 0.0
    # The next look at its alert conditions between policy cycles (controller.watch_between_
    # cycles), on the monotonic clock, and the newest progress entry that look has read.
    next_watch: float = 0.0
    progress_seen: str | None = None
    saved: str = ""
    db_status: str = ""  # the status the membership thread last read for it
    operators: dict | None = None  # its Operator rows by name, read at its first policy cycle
    # (upgrade id, phase) of the job's upgrade as last recorded (console.services.upgrade_control).
    upgrade_seen: tuple | None = None
    # The database may hold an upgrade of the job under way: its next reconcile looks at it.
    # True when the job is taken (a predecessor may have died mid-upgrade), then set by each
    # membership round from one query for all jobs: an upgrade never waits on a wake-up alone.
    upgrade_open: bool = True
    # A reconcile failed part-way: the supervisor in memory may be past what was carried out
    # and recorded, so the next one starts again from the state last saved.
    reload: bool = False
    # Given up to a controller that joined: the job's next reconcile releases its lease, so a
    # reconcile under way ends before the lease is free (its commands are not refused halfway).
    hand_over: bool = False


def below_share(
    holders: dict[str, str | None], controllers: list[str], share: int, me: str
) -> bool:
    """Whether a live controller other than `me` holds fewer than `share` of the jobs
    (`holders`: the holder of each live job `me` does not hold): only then is a surplus
    handed over, since a job given up with nobody below their share to take it would wait."""
    held = Counter(holders.values())
    return any(held[owner] < share for owner in controllers if owner != me)


def rendezvous_rank(owner: str, job_key: str) -> str:
    """Highest random weight hashing: each controller orders the jobs its own way, so with
    equal shares they mostly pick different jobs first."""
    return hashlib.blake2b(f"{owner}/{job_key}".encode(), digest_size=8).hexdigest()


class FleetController:
    """The supervision of one controller process: `workers` reconcile threads, one membership
    thread and one agent events thread. `start` and `stop` are called by the Celery worker
    that consumes the control queue (workers/controller.py)."""

    def __init__(self, workers: int, client=None, owner: str | None = None):
        self.workers = workers
        self.client = client or redis_client()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leases = leases.Leases(self.client, self.owner, LEASE_S)
        self.queue = WorkQueue()
        self.slots: dict[str, JobSlot] = {}
        # Each free live job since the membership round that first saw it free (monotonic).
        self.free_since: dict[str, float] = {}
        self.slots_lock = threading.Lock()
        self.view: FleetView | None = None
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = []
        self.backoff = FailureBackoff()
        self.reconciles = 0
        self.errors = 0  # reconciles that raised (logged with their traceback)
        self.membership_errors = 0  # membership rounds that raised (logged)
        self.reconcile_seconds = 0.0  # total time of the reconciles the workers ran
        self.reconcile_count = 0
        self.stats_lock = threading.Lock()
        self.failed: str | None = None  # why the controller gave every job up, if it did

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the threads (daemons: they end with the process)."""
        targets = [
            ("leases", self._renew_loop),
            ("membership", self._membership_loop),
            ("agent-events", self._events_loop),
        ]
        targets += [(f"reconcile-{i}", self._worker_loop) for i in range(self.workers)]
        for name, target in targets:
            thread = threading.Thread(
                target=self._guarded(target), name=f"fleet-{name}", daemon=True
            )
            thread.start()
            self.threads.append(thread)
        log.info("controller %s supervises with %d workers", self.owner, self.workers)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop taking work, let running reconciles end, give every lease up for the others."""
        self.stopping.set()
        self.queue.shut_down()
        for thread in self.threads:
            thread.join(timeout_s)
        self._give_everything_up()

    def _guarded(self, target):
        """`target` run so that its end, unless the controller is stopping, makes the
        controller give every job up (the exception, if any, is logged with its traceback by
        threading's excepthook)."""

        def run() -> None:
            try:
                target()
            finally:
                if not self.stopping.is_set():
                    self._abdicate(f"thread {threading.current_thread().name} ended")

        return run

    def _abdicate(self, why: str) -> None:
        """A thread of this controller is gone: it can no longer supervise as it should (a
        frozen view, stop requests unseen, jobs without reconciles), so it stops and gives its
        leases and its place in the membership up for the others to take its jobs at once."""
        with self.stats_lock:
            if self.failed is not None:
                return
            self.failed = why
        log.critical("controller %s: %s: giving every job up for the others", self.owner, why)
        self.stopping.set()
        self.queue.shut_down()
        # Reconciles under way end first: the leases are free only once nothing acts on them.
        for thread in self.threads:
            if thread is not threading.current_thread() and "reconcile" in thread.name:
                thread.join(ABDICATE_WAIT_S)
        try:
            self._give_everything_up()
        except redis.RedisError as exc:
            # The leases expire after LEASE_S anyway: nothing renews them any more.
            log.warning("controller %s: leases not released: %s", self.owner, exc)

    def _give_everything_up(self) -> None:
        with self.slots_lock:
            held = list(self.slots)
            self.slots.clear()
        for key in held:
            self.leases.release(key)
        leases.leave(self.client, self.owner)

    def held(self) -> list[str]:
        """The keys of the jobs this controller supervises now."""
        with self.slots_lock:
            return sorted(self.slots)

    # --- membership: leases, fair share, the fleet view ------------------------------------

    def _renew_loop(self) -> None:
        """Renew our leases every RENEW_S in a thread of their own: taking a few hundred jobs
        over (each one's state read) must not delay the renewal of those already held past
        their lease."""
        while not self.stopping.is_set():
            started = time.monotonic()
            dead = [t.name for t in self.threads if not t.is_alive()]
            if dead:
                # Renewing for a controller that cannot supervise would keep its jobs from
                # the others (its threads normally say so themselves: `_guarded`).
                self._abdicate(f"thread {', '.join(dead)} not running")
                return
            try:
                leases.heartbeat(self.client, self.owner)
                for key in self.leases.renew(self.held()):
                    log.warning("controller %s: lease of %s lost", self.owner, key)
                    self._drop(key)
                    self.leases.forget(key)
                self._publish_stats()
            except redis.RedisError as exc:
                log.warning("controller %s: leases not renewed: %s", self.owner, exc)
            self.stopping.wait(max(0.0, RENEW_S - (time.monotonic() - started)))

    def stats(self) -> dict[str, float]:
        """This controller's work-queue figures, as /metrics exports them."""
        with self.stats_lock:
            return {
                "queue_depth": len(self.queue),
                "held": len(self.held()),
                "failing": self.backoff.failing(),
                "reconciles": self.reconcile_count,
                "reconcile_seconds": round(self.reconcile_seconds, 6),
                "reconcile_errors": self.errors,
                "membership_errors": self.membership_errors,
            }

    def _publish_stats(self) -> None:
        """Where /metrics reads them (every web worker alike): nothing is counted in its
        memory (console.services.prometheus)."""
        key = control_keys.controller_stats(self.owner)
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping=self.stats())
            pipe.expire(key, int(STATS_TTL_S))
            pipe.execute()

    def _membership_loop(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.settle_membership()
            except (DatabaseError, redis.RedisError) as exc:
                self._count_membership_error()
                log.warning("controller %s: membership round failed: %s", self.owner, exc)
                _drop_broken_connection()
            except Exception:
                # A bug met by one round must not end the thread: the leases would still be
                # renewed while the view, the stop requests and the fair share froze.
                self._count_membership_error()
                log.exception("controller %s: membership round raised", self.owner)
                _drop_broken_connection()
            self.stopping.wait(max(0.0, RENEW_S - (time.monotonic() - started)))

    def _count_membership_error(self) -> None:
        with self.stats_lock:
            self.membership_errors += 1

    def settle_membership(self) -> None:
        """One round: read the live jobs and the fleet view, take jobs up to our fair share or
        give the surplus up (the leases and our heartbeat are renewed by their own thread)."""
        live = {
            key: (pk, status)
            for pk, key, status in Job.objects.filter(status__in=Job.LIVE_STATUSES).values_list(
                "pk", "key", "status"
            )
        }
        self.view = read_fleet_view(self.client)
        controllers = leases.live_controllers(self.client, CONTROLLER_ALIVE_S)
        share = leases.fair_share(len(live), len(controllers))
        with self.slots_lock:
            held = dict(self.slots)
        for key, slot in held.items():
            status = live.get(key, (None, "ended"))[1]
            if status != slot.db_status:
                slot.db_status = status
                self.queue.add(key)  # a stop request or an end: handled at once
        for key in upgrading_jobs(held):
            held[key].upgrade_open = True
        wanted = [key for key in live if key not in held]
        holders = self.leases.holders(wanted)
        surplus = len(held) - share
        if surplus > 0 and below_share(holders, controllers, share, self.owner):
            # Give up the jobs others rank first, at most a few per round to avoid churn.
            for key in sorted(held, key=lambda k: rendezvous_rank(self.owner, k))[:surplus][:5]:
                held[key].hand_over = True
                self.queue.add(key, urgent=True)
        free = sorted(
            (key for key in wanted if holders[key] is None),
            key=lambda k: rendezvous_rank(self.owner, k),
            reverse=True,
        )
        # A job whose lease ran out is taken at once, over our share too: its controller died
        # or stalled, and its replacement may take seconds to come up (6.5 s at load 10 in the
        # chaos run of 2026-11-29) while the job goes unsupervised. So is a job left free for
        # FREE_WAIT_S: handed to a controller that has not taken it (paused, or still coming
        # up: 6 s unsupervised in the next chaos run). The split evens out by hand-overs once
        # a controller below its share is there to take them.
        now = time.monotonic()
        self.free_since = {key: self.free_since.get(key, now) for key in free}
        orphans = leases.expired(self.client, free)
        orphans |= {key for key in free if now - self.free_since[key] >= FREE_WAIT_S}
        room = max(0, share - len(held))
        taking = [key for key in free if key in orphans]
        taking += [key for key in free if key not in orphans][:room]
        if taking and not self.stopping.is_set():
            self._take(self.leases.try_acquire_all(taking), live)

    def _take(self, taken: list[str], live: dict[str, tuple[int, str]]) -> None:
        """Supervise the jobs whose leases were just taken: their rows in one query (dozens at
        once after a controller died), each queued for its first reconcile."""
        jobs = Job.objects.in_bulk([live[key][0] for key in taken])
        for key in taken:
            pk, status = live[key]
            job = jobs.get(pk)
            if job is None:
                # Deleted since this round read the live jobs: nothing to supervise.
                self.leases.release(key)
                continue
            # The supervision state is read by the job's first reconcile, not here: a state
            # this version cannot read fails that job's reconciles (retried, reported), not
            # the round.
            slot = JobSlot(job=job, supervisor=None, db_status=status, reload=True)
            with self.slots_lock:
                self.slots[key] = slot
            self.queue.add(key)
            log.info("controller %s: supervising %s", self.owner, key)

    def _drop(self, key: str) -> None:
        """Stop supervising `key`: no reconcile of it is queued again and its lease token is
        forgotten (a lease lost is not ours to release; `_end` releases one still held)."""
        with self.slots_lock:
            self.slots.pop(key, None)
        self.queue.forget(key)

    # --- agent events: wake the job a report is about --------------------------------------

    def _events_loop(self) -> None:
        last = None  # the newest entry read; "$" in every call would miss those between calls
        while not self.stopping.is_set():
            try:
                if last is None:
                    newest = self.client.xrevrange(control_keys.agent_events(), count=1)
                    last = newest[0][0] if newest else "0-0"
                batches = self.client.xread(
                    {control_keys.agent_events(): last}, count=500, block=EVENTS_BLOCK_MS
                )
            except redis.RedisError as exc:
                log.warning("controller %s: agent events unreadable: %s", self.owner, exc)
                self.stopping.wait(ERROR_RETRY_S)
                continue
            except Exception:
                log.exception("controller %s: agent events read raised", self.owner)
                self.stopping.wait(ERROR_RETRY_S)
                continue
            for _, entries in batches:
                for entry_id, fields in entries:
                    last = entry_id
                    key = fields.get("job")
                    if key in self.slots:
                        self.queue.add(key, urgent=True)

    # --- reconcile ---------------------------------------------------------------------------

    def _worker_loop(self) -> None:
        while not self.stopping.is_set():
            key = self.queue.get()
            if key is None:
                return
            delay = None
            started = time.monotonic()
            try:
                with acting_under(self.leases.token(key)):
                    delay = self.reconcile(key)
            except LeaseLost as exc:
                # Another controller took the job midway: whatever this one still meant to do
                # is its successor's now (and the receivers refuse it anyway).
                log.warning("controller %s: %s", self.owner, exc)
                self._drop(key)
                self.leases.forget(key)
            except (DatabaseError, redis.RedisError) as exc:
                log.warning("controller %s: reconcile of %s failed: %s", self.owner, key, exc)
                _drop_broken_connection()
                delay = min(self._failed(key, exc), TRANSIENT_RETRY_CAP_S)
            except Exception as exc:
                # One job's bug must not end this worker (the others would go unsupervised).
                log.exception("controller %s: reconcile of %s raised", self.owner, key)
                delay = self._failed(key, exc)
            else:
                self._succeeded(key)
            finally:
                with self.stats_lock:
                    self.reconcile_count += 1
                    self.reconcile_seconds += time.monotonic() - started
                self.queue.done(key, delay)

    def _failed(self, key: str, exc: Exception) -> float:
        """Count a failed reconcile of `key` and record it for the job page, /metrics and the
        alert; returns when to try the job again (its backoff)."""
        with self.stats_lock:
            self.errors += 1
        self._reload_next_time(key)
        failures, delay = self.backoff.failed(key)
        with self.slots_lock:
            slot = self.slots.get(key)
        if slot is not None:
            error = f"{type(exc).__name__}: {exc}"
            try:
                record_reconcile_failure(self.client, slot.job, failures, error, delay, self.owner)
            except Exception:
                # Recording is for people; the retry must happen whatever it met.
                log.exception("controller %s: failure of %s not recorded", self.owner, key)
        return delay

    def _succeeded(self, key: str) -> None:
        """A reconcile of `key` ended without an error: a failure streak it ends is cleared."""
        if self.backoff.succeeded(key):
            clear_reconcile_failure(self.client, key)
            log.info("controller %s: %s reconciles again", self.owner, key)

    def _reload_next_time(self, key: str) -> None:
        """After a reconcile that failed part-way (a failure handled in memory whose record the
        database refused, and whose promotion was then never sent): the next reconcile reads
        the state last saved, as a controller taking the job over would, and sees the failure
        again. Every side effect is idempotent, so what the failed one did is safe to redo."""
        with self.slots_lock:
            slot = self.slots.get(key)
        if slot is not None:
            slot.reload = True

    def reconcile(self, key: str) -> float | None:
        """One reconcile of the job `key`: returns when to reconcile it again (None: it ended,
        or is no longer ours)."""
        with self.slots_lock:
            slot = self.slots.get(key)
        if slot is None or self.view is None:
            return None
        if slot.hand_over:
            return self._end(key)
        self.reconciles += 1
        job = slot.job
        if slot.db_status != job.status:
            try:
                job.refresh_from_db(fields=["status", "status_reason"])
            except Job.DoesNotExist:
                return self._deleted(key, slot)
        if not self.leases.holds(key):
            # Gone (taken over, or gone with Redis's data): act on nothing, not even from the
            # supervisor kept in memory, whose view of a Redis that lost its data would restart
            # every replica (docs/RELIABILITY.md, "Redis without its data").
            self._drop(key)
            return None
        if slot.reload:
            slot.supervisor = load_supervisor(self.client, job)  # `slot.saved` is that state
            slot.reload = False
            if slot.supervisor is not None and job.status != Job.Status.STOPPING:
                # A predecessor's starts and promotions may have been refused (its lease
                # went before they arrived): what the state still waits for is sent again.
                controller.reissue_pending(job, slot.supervisor, self.client)
        if slot.supervisor is None:
            controller.without_state(job, self.client)
            return self._end(key)
        live = controller.reconcile_job(job, slot.supervisor, self.client, self.view, slot)
        if not self._save(key, slot):
            log.warning(
                "controller %s: lease of %s lost before its state was saved", self.owner, key
            )
            self._drop(key)
            return None
        if not live:
            return self._end(key)
        return controller.next_reconcile_s(job, slot.supervisor, FAST_PERIOD_S, STEADY_PERIOD_S)

    def _deleted(self, key: str, slot: JobSlot) -> None:
        """The job was deleted from the database while live: its replicas are killed where the
        supervisor placed them, its control-plane keys deleted and its lease released, once
        (it is in no later round's live jobs, so nobody takes it again)."""
        if not self.leases.holds(key):
            self._drop(key)
            return None
        supervisor = slot.supervisor
        if slot.reload or supervisor is None:
            supervisor = load_supervisor(self.client, slot.job)
        stop_deleted_job(slot.job, supervisor, self.client)
        log.warning("controller %s: job %s was deleted while live: stopped", self.owner, key)
        return self._end(key)

    def _save(self, key: str, slot: JobSlot) -> bool:
        """Save the supervision state if it changed, only while the lease is ours."""
        state = json.dumps(slot.supervisor.to_dict())
        if state == slot.saved:
            return True
        if not self.leases.replace_if_held(key, control_keys.controller_state(key), state):
            return False
        slot.saved = state
        return True

    def _end(self, key: str) -> None:
        self._drop(key)
        self.leases.release(key)
        return None


def upgrading_jobs(held: dict) -> set[str]:
    """The keys among `held` of the jobs with an upgrade under way in the database, in one
    query: each one's reconcile looks at its record (desired) against its supervisor (actual)."""
    if not held:
        return set()
    # Few upgrades are under way at a time: filtered here rather than by a list of every key.
    upgrading = JobUpgrade.objects.filter(
        status__in=JobUpgrade.UNDER_WAY, job__status__in=Job.LIVE_STATUSES
    ).values_list("job__key", flat=True)
    return set(upgrading) & set(held)


def _drop_broken_connection() -> None:
    """A database error may leave this thread's connection unusable: open a new one next time."""
    connection.close_if_unusable_or_obsolete()


def controller_stats(client) -> dict[str, dict[str, float]]:
    """owner -> the figures each live controller last published (FleetController.stats), in
    one round trip after the membership read."""
    owners = leases.live_controllers(client, CONTROLLER_ALIVE_S)
    with client.pipeline(transaction=False) as pipe:
        for owner in owners:
            pipe.hgetall(control_keys.controller_stats(owner))
        published = pipe.execute()
    stats = {}
    for owner, figures in zip(owners, published, strict=True):
        try:
            stats[owner] = {name: float(value) for name, value in figures.items()}
        except ValueError:
            log.warning("figures of controller %s are malformed, left out", owner)
    return stats
