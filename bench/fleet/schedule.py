"""The seeded fault schedule of a fleet run: process kills, node kills and one controller kill.

`plan_faults` fixes the times (offsets into the measured window) from the seed; which replica or
node a fault hits is drawn when it fires, from what runs then, with the same seeded generator,
so a run is repeatable as far as the controller's timing lets it be.

- process kill: a stage replica that has run a batch dies (SIGKILL); its agent reports the exit.
  A job is hit at most once per JOB_COOLDOWN_S, so each kill is a fault the controller answers
  rather than a crash loop (whose restarts wait out a backoff by design);
- node kill: every process of a node dies with its agent: no exit is reported, the node's
  heartbeats stop and its queue is not read for NODE_DOWN_S, then it comes back empty;
- controller kill: SIGKILL one controller process (the launcher does not start it again; with
  `restart_after_s` it is started again that long after: at once in a chaos run). Only with
  two controllers or more unless a restart is asked for: a lone controller killed for good
  leaves nothing to measure.
"""

from __future__ import annotations

import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from bench.fleet.sim import FleetSim

PROCESS, NODE, CONTROLLER = "process", "node", "controller"
JOB_COOLDOWN_S = 30.0
NODE_DOWN_S = 20.0
LAST_KILL_BEFORE_END_S = 10.0  # the last process kill leaves this long to be answered


@dataclass(frozen=True)
class PlannedFault:
    offset_s: float
    kind: str


@dataclass
class FaultRecord:
    """A fault as it was carried out (`at`: epoch seconds)."""

    kind: str
    at: float
    job: str = ""
    stage: str = ""
    replica_id: str = ""
    role: str = ""
    node: str = ""
    controller: str = ""
    pid: int | None = None
    victims: list[dict] = field(default_factory=list)  # a node kill's replicas
    holders_before: dict = field(default_factory=dict)  # job -> lease token, before the kill
    restarted_at: float | None = None
    skipped: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def plan_faults(
    duration_s: float,
    seed: int,
    kill_every_s: float,
    nodes: int,
    controllers: int,
    node_kills: int | None = None,
    controller_kill: bool = True,
) -> list[PlannedFault]:
    """The fault times of a window of `duration_s`: process kills every `kill_every_s` (with
    seeded jitter), from 2 s in until LAST_KILL_BEFORE_END_S before the end; `node_kills` node
    kills (default: one when there are 3 nodes or more and the window is 60 s or longer) spread
    over the first two thirds; one controller kill at 55 % of the window."""
    rng = random.Random(seed)
    planned = []
    if kill_every_s > 0:
        offset = 2.0
        while offset <= duration_s - LAST_KILL_BEFORE_END_S:
            planned.append(PlannedFault(round(offset, 2), PROCESS))
            offset += kill_every_s * rng.uniform(0.6, 1.4)
    if node_kills is None:
        node_kills = 1 if nodes >= 3 and duration_s >= 60 else 0
    for i in range(node_kills):
        planned.append(PlannedFault(round(duration_s * (0.25 + 0.4 * i / node_kills), 2), NODE))
    if controller_kill:
        planned.append(PlannedFault(round(duration_s * 0.55, 2), CONTROLLER))
    return sorted(planned, key=lambda f: f.offset_s)


class PlanThread(ABC):
    """A plan carried out in a thread of its own, named `thread_name`, from `start(start_at)`
    (epoch seconds) until it ends or `stop()` is called (`stopping` is set then)."""

    thread_name = "fleet-plan"

    def __init__(self):
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, start_at: float) -> None:
        self.thread = threading.Thread(
            target=self._run, args=(start_at,), name=self.thread_name, daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        """End the plan and wait for its thread."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(30)

    @abstractmethod
    def _run(self, start_at: float) -> None:
        """Carry the plan out (each subclass its own)."""


class FaultRunner(PlanThread):
    """Carries out a plan from `start_at` (epoch seconds) in a thread; `records` says what each
    fault hit and when.

    kill_controller: a callable that SIGKILLs one controller and returns (its name, its pid,
    the time of the kill, the lease holders of the jobs read just before), or None when there
    is none to kill; restart_controller: starts it again (by name), for `restart_after_s`."""

    thread_name = "fleet-faults"

    def __init__(
        self,
        sim: FleetSim,
        plan: list[PlannedFault],
        seed: int,
        kill_controller: Callable[[], tuple[str, int, float, dict] | None],
        restart_controller: Callable[[str], None] | None = None,
        restart_after_s: float | None = None,
        node_down_s: float = NODE_DOWN_S,
        say: Callable[[str], None] | None = None,
    ):
        super().__init__()
        self.sim = sim
        self.plan = plan
        self.rng = random.Random(seed + 1)
        self.kill_controller = kill_controller
        self.restart_controller = restart_controller
        self.restart_after_s = restart_after_s
        self.node_down_s = node_down_s
        self.say = say or (lambda _m: None)
        self.records: list[FaultRecord] = []
        self.last_hit: dict[str, float] = {}
        self.spared: set[str] = set()  # jobs no process kill hits (`spare`)

    def spare(self, job: str) -> None:
        """No process kill hits `job` from now on (a job being upgraded in the chaos run)."""
        self.spared.add(job)

    def _run(self, start_at: float) -> None:
        pending_restart: tuple[float, str, FaultRecord] | None = None
        for fault in self.plan:
            while not self.stopping.is_set():
                now = time.time()
                if pending_restart is not None and now >= pending_restart[0]:
                    self._restart(*pending_restart[1:])
                    pending_restart = None
                wait = start_at + fault.offset_s - now
                if wait <= 0:
                    break
                self.stopping.wait(min(wait, 0.2))
            if self.stopping.is_set():
                break
            record = self.fire(fault.kind)
            restarts = self.restart_after_s is not None
            if record.kind == CONTROLLER and record.controller and restarts:
                pending_restart = (record.at + self.restart_after_s, record.controller, record)
        while pending_restart is not None and not self.stopping.wait(0.2):
            if time.time() >= pending_restart[0]:
                self._restart(*pending_restart[1:])
                pending_restart = None

    def _restart(self, name: str, record: FaultRecord) -> None:
        if self.restart_controller is not None:
            self.restart_controller(name)
            record.restarted_at = time.time()
            self.say(f"started {name} again")

    def fire(self, kind: str) -> FaultRecord:
        """Carry out one fault of `kind` now."""
        if kind == PROCESS:
            record = self._kill_process()
        elif kind == NODE:
            record = self._kill_node()
        else:
            record = self._kill_controller()
        self.records.append(record)
        return record

    def _kill_process(self) -> FaultRecord:
        now = time.time()
        candidates = [
            r
            for r in self.sim.running_replicas()
            if now - self.last_hit.get(r.job, -1e9) >= JOB_COOLDOWN_S and r.job not in self.spared
        ]
        if not candidates:
            return FaultRecord(PROCESS, now, skipped="no replica that ran a batch, off cooldown")
        victim = self.rng.choice(sorted(candidates, key=lambda r: r.pid))
        if self.sim.kill_process(victim.pid) is None:
            return FaultRecord(PROCESS, now, skipped=f"{victim.replica_id} gone meanwhile")
        self.last_hit[victim.job] = now
        return FaultRecord(
            PROCESS, now, job=victim.job, stage=victim.stage, replica_id=victim.replica_id,
            role=victim.role, node=victim.node, pid=victim.pid,
        )  # fmt: skip

    def _kill_node(self) -> FaultRecord:
        now = time.time()
        with self.sim.lock:
            up = sorted(a.name for a in self.sim.agents.values() if a.up)
        if len(up) < 2:
            return FaultRecord(NODE, now, skipped="fewer than two nodes up")
        node = self.rng.choice(up)
        victims = self.sim.kill_node(node, self.node_down_s)
        for replica in victims:
            self.last_hit[replica.job] = now
        self.say(f"node {node} down for {self.node_down_s:g} s ({len(victims)} processes)")
        return FaultRecord(
            NODE,
            now,
            node=node,
            victims=[
                {"job": r.job, "stage": r.stage, "replica_id": r.replica_id, "role": r.role}
                for r in victims
                if not r.generator
            ],
        )

    def _kill_controller(self) -> FaultRecord:
        killed = self.kill_controller()
        if killed is None:
            return FaultRecord(CONTROLLER, time.time(), skipped="no controller to kill")
        name, pid, at, holders = killed
        self.say(f"SIGKILLed {name} (pid {pid})")
        return FaultRecord(CONTROLLER, at, controller=name, pid=pid, holders_before=holders)
