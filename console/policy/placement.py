"""Standby placement: Da-Stream's Algorithm 1 (initial) and Algorithm 2 (every cycle).

Both keep a resource reserve: after any standby they place, the cluster's free cpu and free
memory, each as a fraction of the cluster total (alive nodes only), must stay at or above
`config.resource_reserve`. Following the paper, placement stops at the first operator whose
standby would cross the reserve, and every operator after it falls back to passive: a lower
priority operator never gets a standby that a higher priority one was refused for lack of reserve.
An operator that merely finds no node with room (other than its primary's) falls back alone.

Free resources come from measurements, which already include running standbys; the demand used
for a standby is the operator's demand estimate (`OperatorPriority.cpu`/`.mem`). Replicas a
launch plans but has not started yet (its primaries) are charged to their nodes up front.

Nodes are compared by their Q once the standby runs there (`resources.q_after`): the measured Q,
lowered by the idle share of what this run has placed on the node so far and of the standby
itself, raised by what this run released there. So when every node is equally idle (a launch
before any load), a node the plan already gives a primary or a standby ranks below an untouched
one; exact ties go by node name.

Every run also says why each standby sits where it is (`StandbyVerdict`): the rule that placed,
moved or kept it, with the Q figures, and the reserve check after the run.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from console.policy.actions import (
    Action,
    AddStandby,
    DropStandby,
    MoveStandby,
    SetCheckpointInterval,
)
from console.policy.checkpoint import adjust_interval, initial_interval
from console.policy.config import PolicyConfig
from console.policy.priority import ACTIVE, OperatorPriority
from console.policy.resources import (
    NodeCapacity,
    NodeSample,
    cluster_rates,
    node_capacities,
    q_after,
    q_scale,
)

# Intervals closer than this are "unchanged": no action is emitted for float noise.
INTERVAL_EPSILON_S = 1e-6

# A move restarts the standby elsewhere, and the stage is unprotected until the new one has
# caught up, so Algorithm 2 moves a healthy standby only for a clear gain: another node's Q with
# the standby on it must beat its current node's Q by this share of Q's full scale (q_scale,
# 2.33 with the defaults, so a margin of 0.47). A tenth (0.23) was tried first: on a live
# 3-node cluster the estimate of a standby's load (its operator's demand) and its measured load
# differ by about that much, and a standby was moved 90 s after launch for no real gain ...
MOVE_MARGIN_SHARE = 0.2
# ... and only once the standby has run this long where it is: a starting JVM's load, its
# catch-up, and the load it left behind on its old node take a while to show in the samples Q
# is made of; judged sooner, a standby would be moved back and forth.
MOVE_SETTLE_S = 120.0

# The rules a StandbyVerdict names.
PLACED_AT_LAUNCH = "placed at launch"
ADDED = "added"
MOVED = "moved"
KEPT = "kept"


class _Ledger:
    """Free resources and Q per alive node during one placement run, and the reserve rule.

    Released and taken resources are kept apart: a released standby's demand is credited to the
    node's measured free resources (capped at the node's total, since the measurement may not
    have charged the standby's full estimate), and new standbys are charged on top. Keeping them
    apart makes the result independent of the order of releases and placements.
    """

    def __init__(self, nodes: Mapping[str, NodeCapacity], config: PolicyConfig):
        alive = [n for n in nodes.values() if n.alive]
        self.nodes = {n.name: n for n in alive}
        self.config = config
        self.released_cpu = dict.fromkeys(self.nodes, 0.0)
        self.released_mem = dict.fromkeys(self.nodes, 0.0)
        self.taken_cpu = dict.fromkeys(self.nodes, 0.0)
        self.taken_mem = dict.fromkeys(self.nodes, 0.0)
        self.cpu_total = sum(n.cpu_total for n in alive)
        self.mem_total = sum(n.mem_total for n in alive)
        self.reserve = config.resource_reserve

    def cpu_free(self, node: str) -> float:
        """Free cores on `node` now."""
        n = self.nodes[node]
        return min(n.cpu_total, n.cpu_free + self.released_cpu[node]) - self.taken_cpu[node]

    def mem_free(self, node: str) -> float:
        """Free memory on `node` now."""
        n = self.nodes[node]
        return min(n.mem_total, n.mem_free + self.released_mem[node]) - self.taken_mem[node]

    def q(self, node: str, cpu: float = 0.0, mem: float = 0.0) -> float:
        """Estimated Q of `node` after this run's releases and placements and `cpu`/`mem` more."""
        n = self.nodes[node]
        more_cpu = n.cpu_free - self.cpu_free(node) + cpu
        more_mem = n.mem_free - self.mem_free(node) + mem
        return q_after(n, more_cpu, more_mem, self.config)

    def free_fractions(self, cpu: float = 0.0, mem: float = 0.0) -> tuple[float, float]:
        """Cluster free cpu and memory fractions after taking `cpu` and `mem` more."""
        if self.cpu_total <= 0 or self.mem_total <= 0:
            return 0.0, 0.0
        return (
            (sum(self.cpu_free(n) for n in self.nodes) - cpu) / self.cpu_total,
            (sum(self.mem_free(n) for n in self.nodes) - mem) / self.mem_total,
        )

    def keeps_reserve(self, cpu: float = 0.0, mem: float = 0.0) -> bool:
        """True if taking `cpu` and `mem` more leaves both free fractions >= the reserve."""
        free_cpu, free_mem = self.free_fractions(cpu, mem)
        return free_cpu >= self.reserve and free_mem >= self.reserve

    def describe(self, cpu: float = 0.0, mem: float = 0.0) -> str:
        """Free fractions after taking `cpu`/`mem`, for reasons."""
        free_cpu, free_mem = self.free_fractions(cpu, mem)
        return f"cpu {free_cpu:.0%} / mem {free_mem:.0%} free vs reserve {self.reserve:.0%}"

    def ranked(self, cpu: float, mem: float, exclude: Collection[str | None]) -> list[tuple]:
        """(node, Q once it runs the demand) for alive nodes not in `exclude` with room for the
        demand, highest Q first, ties by name."""
        rows = [
            (name, self.q(name, cpu, mem))
            for name in self.nodes
            if name not in exclude and self.cpu_free(name) >= cpu and self.mem_free(name) >= mem
        ]
        return sorted(rows, key=lambda row: (-row[1], row[0]))

    def take(self, node: str, cpu: float, mem: float) -> None:
        """Account for a replica placed on `node`."""
        self.taken_cpu[node] += cpu
        self.taken_mem[node] += mem

    def untake(self, node: str, cpu: float, mem: float) -> None:
        """Undo a `take` made earlier in this run."""
        self.taken_cpu[node] -= cpu
        self.taken_mem[node] -= mem

    def release(self, node: str, cpu: float, mem: float) -> None:
        """Account for a measured standby removed from `node` (dead nodes do not count)."""
        if node in self.nodes:
            self.released_cpu[node] += cpu
            self.released_mem[node] += mem

    def unrelease(self, node: str, cpu: float, mem: float) -> None:
        """Undo a `release` made earlier in this run."""
        if node in self.nodes:
            self.released_cpu[node] -= cpu
            self.released_mem[node] -= mem


def _best_sentence(ranked: list[tuple], primary: str | None) -> str:
    """Why ranked[0] wins, with the runners-up: "node-3 has the highest Q with this standby ..."."""
    others = f"other than its primary's ({primary}) " if primary else ""
    figures = ", ".join(f"{name} {q:.2f}" for name, q in ranked[:3])
    tie = "; a tie, broken by name" if len(ranked) > 1 and ranked[1][1] == ranked[0][1] else ""
    return (
        f"{ranked[0][0]} has the highest Q with this standby among alive nodes {others}"
        f"with room ({figures}{tie})"
    )


@dataclass(frozen=True)
class StandbyVerdict:
    """Why `operator`'s standby sits on `node` after a placement run.

    `rule` is PLACED_AT_LAUNCH, ADDED, MOVED or KEPT; `reason` is a sentence that starts with the
    rule and gives the Q figures behind it; `reserve` is the reserve check after the run.
    """

    operator: str
    node: str
    rule: str
    reason: str
    reserve: str

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return asdict(self)


def _verdicts(
    judged: Mapping[str, tuple[str, str, str]], ledger: _Ledger, run: str
) -> dict[str, StandbyVerdict]:
    """StandbyVerdicts from operator -> (node, rule, reason), with the reserve after the run
    (each placement checked it, and later ones only take more, so the end state passed too)."""
    reserve = f"kept after {run}: {ledger.describe()}"
    return {
        op: StandbyVerdict(op, node, rule, reason, reserve)
        for op, (node, rule, reason) in judged.items()
    }


@dataclass(frozen=True)
class Fallback:
    """An active operator that gets no standby (it runs passive) and why."""

    operator: str
    reason: str

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return {"operator": self.operator, "reason": self.reason}


@dataclass(frozen=True)
class Placement:
    """Result of Algorithm 1: operator -> standby node, the fallbacks with reasons, and why each
    standby sits where it is."""

    standbys: dict[str, str] = field(default_factory=dict)
    fallbacks: tuple[Fallback, ...] = ()
    verdicts: dict[str, StandbyVerdict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return {
            "standbys": dict(self.standbys),
            "fallbacks": [f.to_dict() for f in self.fallbacks],
            "verdicts": {op: v.to_dict() for op, v in self.verdicts.items()},
        }


def _by_priority(priorities: Sequence[OperatorPriority]) -> list[OperatorPriority]:
    # P_eff (priority raised by predicted fault risk) decides; the name breaks ties so the
    # result does not depend on input order.
    return sorted(priorities, key=lambda p: (-p.P_eff, p.name))


def _place_in_order(
    candidates: Sequence[OperatorPriority],
    primaries: Mapping[str, str],
    ledger: _Ledger,
) -> tuple[dict[str, tuple[str, str]], list[Fallback]]:
    """Give each candidate (already sorted) the best node; stop at the reserve.

    Returns operator -> (node, why that node) for the placed ones, and the fallbacks.
    """
    placed: dict[str, tuple[str, str]] = {}
    fallbacks: list[Fallback] = []
    stopped_at: str | None = None
    for op in candidates:
        if stopped_at is not None:
            fallbacks.append(
                Fallback(op.name, f"reserve reached at higher-priority operator {stopped_at}")
            )
            continue
        if not ledger.keeps_reserve(op.cpu, op.mem):
            stopped_at = op.name
            fallbacks.append(
                Fallback(
                    op.name,
                    f"reserve: a standby (cpu {op.cpu:g}, mem {op.mem:g}) would leave "
                    f"{ledger.describe(op.cpu, op.mem)}",
                )
            )
            continue
        primary = primaries.get(op.name)
        ranked = ledger.ranked(op.cpu, op.mem, exclude={primary})
        if not ranked:
            fallbacks.append(
                Fallback(
                    op.name,
                    f"no alive node other than primary {primary} has room for "
                    f"cpu {op.cpu:g}, mem {op.mem:g}",
                )
            )
            continue
        node = ranked[0][0]
        ledger.take(node, op.cpu, op.mem)
        placed[op.name] = (node, _best_sentence(ranked, primary))
    return placed, fallbacks


def place_standbys(
    priorities: Sequence[OperatorPriority],
    primaries: Mapping[str, str],
    nodes: Mapping[str, NodeCapacity],
    config: PolicyConfig,
    planned: Mapping[str, tuple[float, float]] | None = None,
) -> Placement:
    """Algorithm 1: initial standby placement.

    Active operators, by P_eff descending, each get the alive node that is not their primary's
    node, has room for their demand and has the highest Q once it runs the standby, until the
    reserve would be crossed. Operators without a primary entry may go on any node. `planned`
    (node -> (cpu, mem)) is what a launch will start besides the standbys and the measurements
    cannot show yet, its primaries: it is charged to those nodes first, for room, Q and reserve.
    """
    ledger = _Ledger(nodes, config)
    for node, (cpu, mem) in (planned or {}).items():
        if node in ledger.nodes:
            ledger.take(node, cpu, mem)
    active = [p for p in _by_priority(priorities) if p.mode == ACTIVE]
    placed, fallbacks = _place_in_order(active, primaries, ledger)
    judged = {
        op: (node, PLACED_AT_LAUNCH, f"{PLACED_AT_LAUNCH}: {why}")
        for op, (node, why) in placed.items()
    }
    return Placement(
        standbys={op: node for op, (node, _) in placed.items()},
        fallbacks=tuple(fallbacks),
        verdicts=_verdicts(judged, ledger, "the launch plan"),
    )


@dataclass(frozen=True)
class CycleInput:
    """Everything Algorithm 2 looks at in one cycle.

    - `priorities`: fresh scores (their `fr` is the predicted fault rate, their mode decides
      active/passive, their cpu/mem are the demand estimates).
    - `primaries` / `standbys`: operator -> node where the primary / standby runs now.
    - `samples`: node -> its recent NodeSamples, newest first (Q and free resources).
    - `alive`: node -> alive and healthy; nodes missing here count as dead.
    - `faults`: operator -> faults observed since the last cycle (missing = 0).
    - `slow_tasks`: operator -> slow task count (missing = 0).
    - `intervals`: operator -> current checkpoint interval (missing = not set yet).
    - `utilisation`: operator -> (cpu, mem) utilisation fractions used by the interval rules;
      missing operators use their primary node's newest sample, else the cluster rates.
    - `standby_age_s`: operator -> seconds its standby has run on its node (missing = long
      enough to be judged for a move).
    - `vetoed`: operator -> why it may have no standby now (the host reserve downgraded it to
      checkpoint-only: console.policy.reserve.plan_reserve); its standby is dropped and none is
      added while it is vetoed.
    """

    priorities: Sequence[OperatorPriority]
    primaries: Mapping[str, str]
    standbys: Mapping[str, str]
    samples: Mapping[str, Sequence[NodeSample]]
    alive: Mapping[str, bool]
    faults: Mapping[str, int] = field(default_factory=dict)
    slow_tasks: Mapping[str, int] = field(default_factory=dict)
    intervals: Mapping[str, float] = field(default_factory=dict)
    utilisation: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    standby_age_s: Mapping[str, float] = field(default_factory=dict)
    vetoed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CycleResult:
    """What one Algorithm 2 cycle proposes (`actions`) and why each standby left after them sits
    where it does (`verdicts`, by operator)."""

    actions: list[Action]
    verdicts: dict[str, StandbyVerdict]


def _utilisation(state: CycleInput, operator: str) -> tuple[float, float]:
    if operator in state.utilisation:
        return state.utilisation[operator]
    primary = state.primaries.get(operator)
    history = state.samples.get(primary, ()) if primary else ()
    if history:
        rates = cluster_rates([history[0]])
    else:
        rates = cluster_rates(
            [h[0] for n, h in state.samples.items() if h and state.alive.get(n, False)]
        )
    return rates.cpu, rates.mem


def _move_or_keep(
    op: OperatorPriority, node: str, primary: str | None, age: float | None, ledger: _Ledger
) -> tuple[str | None, str]:
    """Algorithm 2's move rule for a healthy standby (alive node, not its primary's): the node it
    should move to (None: it stays) and why. A move is left booked in the ledger."""
    if age is not None and age < MOVE_SETTLE_S:
        return None, (
            f"{KEPT}: started {age:.0f} s ago; a standby runs {MOVE_SETTLE_S:g} s on its node "
            "before a move is considered"
        )
    stay = ledger.q(node)
    margin = MOVE_MARGIN_SHARE * q_scale(ledger.config)
    ledger.release(node, op.cpu, op.mem)
    ranked = ledger.ranked(op.cpu, op.mem, exclude={primary, node})
    if not ranked:
        ledger.unrelease(node, op.cpu, op.mem)
        besides = f" and its primary's ({primary})" if primary else ""
        return None, (
            f"{KEPT}: no alive node besides {node}{besides} has room for cpu {op.cpu:g}, "
            f"mem {op.mem:g}"
        )
    target, q = ranked[0]
    compared = f"{target} would have Q {q:.2f} with this standby vs {stay:.2f} on {node}"
    if q <= stay + margin:
        ledger.unrelease(node, op.cpu, op.mem)
        return None, (
            f"{KEPT}: the best other node, {compared}, not more than the move margin "
            f"{margin:.2f} higher"
        )
    if not ledger.keeps_reserve(op.cpu, op.mem):
        # Possible only when the measurement had not charged the standby's whole estimate.
        ledger.unrelease(node, op.cpu, op.mem)
        return None, f"{KEPT}: {compared}, but moving would leave {ledger.describe(op.cpu, op.mem)}"
    ledger.take(target, op.cpu, op.mem)
    return target, (
        f"Q {q:.2f} on {target} with this standby vs {stay:.2f} on {node}: more than the move "
        f"margin {margin:.2f} higher"
    )


def run_cycle(state: CycleInput, config: PolicyConfig) -> CycleResult:
    """Algorithm 2: one supervision cycle. Returns the actions to take, performing none, and why
    each standby left after them sits where it does.

    Steps: (1) rank alive nodes by fresh Q; (2) drop standbys of operators that are now passive
    or gone, move standbys off dead nodes and off their primary's node (drop them if no node can
    take them within the reserve), and move a standby that has run MOVE_SETTLE_S on its node to
    another node whose Q with it would be more than MOVE_MARGIN_SHARE of q_scale above its
    node's Q; (3) if the cluster is below the reserve, drop standbys lowest P_eff first until it
    is not; (4) give active operators without a standby one, as Algorithm 1 does; (5) set or
    adjust the checkpoint interval of every operator left without a standby.
    """
    by_name = {p.name: p for p in state.priorities}
    ledger = _Ledger(node_capacities(state.samples, config, state.alive), config)
    actions: list[Action] = []
    standbys: dict[str, str] = {}
    # operator -> (node, rule, reason) of every standby still there after the cycle.
    judged: dict[str, tuple[str, str, str]] = {}
    touched: set[str] = set()

    # Step 2, highest priority first so that moved standbys get the best nodes.
    def current_rank(item: tuple[str, str]) -> tuple[float, str]:
        op = by_name.get(item[0])
        return (-op.P_eff if op else 0.0, item[0])

    for name, node in sorted(state.standbys.items(), key=current_rank):
        op = by_name.get(name)
        if op is None:
            # Its demand is unknown now; the next samples will show what it freed.
            actions.append(DropStandby(name, node, "operator is no longer in the topology"))
            touched.add(name)
            continue
        if op.mode != ACTIVE or name in state.vetoed:
            ledger.release(node, op.cpu, op.mem)
            reason = (
                f"now passive: P_eff {op.P_eff:.3f} <= threshold {config.priority_threshold:g}"
                if op.mode != ACTIVE
                else state.vetoed[name]
            )
            actions.append(DropStandby(name, node, reason))
            touched.add(name)
            continue
        primary = state.primaries.get(name)
        if node in ledger.nodes and node != primary:
            target, why = _move_or_keep(op, node, primary, state.standby_age_s.get(name), ledger)
            if target is None:
                standbys[name] = node
                judged[name] = (node, KEPT, why)
                continue
            touched.add(name)
            standbys[name] = target
            actions.append(MoveStandby(name, node, target, why))
            judged[name] = (target, MOVED, f"{MOVED} from {node}: {why}")
            continue
        why = (
            "its node is dead"
            if node not in ledger.nodes
            else f"it shares node {node} with its primary"
        )
        ledger.release(node, op.cpu, op.mem)
        ranked = (
            ledger.ranked(op.cpu, op.mem, exclude={primary})
            if ledger.keeps_reserve(op.cpu, op.mem)
            else []
        )
        touched.add(name)
        if not ranked:
            actions.append(
                DropStandby(
                    name,
                    node,
                    f"{why} and no other node can take it within the reserve "
                    f"({ledger.describe(op.cpu, op.mem)})",
                )
            )
            continue
        target = ranked[0][0]
        ledger.take(target, op.cpu, op.mem)
        standbys[name] = target
        reason = f"{why}; {_best_sentence(ranked, primary)}"
        actions.append(MoveStandby(name, node, target, reason))
        judged[name] = (target, MOVED, f"{MOVED} from {node}: {reason}")

    # Step 3: measured load may have pushed the cluster below the reserve.
    while standbys and not ledger.keeps_reserve():
        victim = min(standbys, key=lambda n: (by_name[n].P_eff, n))
        op = by_name[victim]
        reason = f"reserve crossed ({ledger.describe()}); lowest P_eff"
        moved = next(
            (a for a in actions if isinstance(a, MoveStandby) and a.operator == victim), None
        )
        if moved is not None:
            # Cancel the move and drop the standby where it still runs (already released there).
            ledger.untake(moved.to_node, op.cpu, op.mem)
            actions.remove(moved)
            actions.append(DropStandby(victim, moved.from_node, reason))
        else:
            ledger.release(standbys[victim], op.cpu, op.mem)
            actions.append(DropStandby(victim, standbys[victim], reason))
        del standbys[victim]
        del judged[victim]
        touched.add(victim)

    # Step 4: active operators without a standby, as in Algorithm 1.
    waiting = [
        p
        for p in _by_priority(state.priorities)
        if p.mode == ACTIVE
        and p.name not in standbys
        and p.name not in touched
        and p.name not in state.vetoed
    ]
    placed, fallbacks = _place_in_order(waiting, state.primaries, ledger)
    reasons = {**state.vetoed, **{f.operator: f.reason for f in fallbacks}}
    for p in waiting:
        if p.name in placed:
            node, why = placed[p.name]
            standbys[p.name] = node
            reason = f"active (P_eff {p.P_eff:.3f} > {config.priority_threshold:g}); {why}"
            actions.append(AddStandby(p.name, node, reason))
            judged[p.name] = (node, ADDED, f"{ADDED}: {reason}")

    # Step 5: every operator without a standby relies on checkpoints.
    for p in state.priorities:
        if p.name in standbys:
            continue
        current = state.intervals.get(p.name)
        if current is None:
            seconds = initial_interval(p.fr, config)
            reason = (
                f"initial: {config.interval_horizon_s:g}*{config.checkpoint_cost_s:g}/"
                f"({p.fr:.3g}*{config.recovery_cost_s:g}) clamped = {seconds:.3g} s"
            )
        else:
            cpu_util, mem_util = _utilisation(state, p.name)
            decision = adjust_interval(
                current,
                fault=state.faults.get(p.name, 0) > 0,
                fr=p.fr,
                cpu_util=cpu_util,
                mem_util=mem_util,
                slow_tasks=state.slow_tasks.get(p.name, 0),
                config=config,
            )
            if abs(decision.seconds - current) <= INTERVAL_EPSILON_S:
                continue
            seconds, reason = decision.seconds, decision.reason
        if p.name in reasons:
            reason = f"no standby ({reasons[p.name]}); {reason}"
        actions.append(SetCheckpointInterval(p.name, seconds, reason))
    return CycleResult(actions, _verdicts(judged, ledger, "this cycle"))
