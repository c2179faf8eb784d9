"""Standby placement: Da-Stream's Algorithm 1 (initial) and Algorithm 2 (every cycle).

Both keep a resource reserve: after any standby they place, the cluster's free cpu and free
memory, each as a fraction of the cluster total (alive nodes only), must stay at or above
`config.resource_reserve`. Following the paper, placement stops at the first operator whose
standby would cross the reserve, and every operator after it falls back to passive: a lower
priority operator never gets a standby that a higher priority one was refused for lack of reserve.
An operator that merely finds no node with room (other than its primary's) falls back alone.

Free resources come from measurements, which already include running standbys; the demand used
for a standby is the operator's demand estimate (`OperatorPriority.cpu`/`.mem`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
from console.policy.resources import NodeCapacity, NodeSample, cluster_rates, node_capacities

# Intervals closer than this are "unchanged": no action is emitted for float noise.
INTERVAL_EPSILON_S = 1e-6


class _Ledger:
    """Free resources per alive node during one placement run, and the reserve rule.

    Released and taken resources are kept apart: a released standby's demand is credited to the
    node's measured free resources (capped at the node's total, since the measurement may not
    have charged the standby's full estimate), and new standbys are charged on top. Keeping them
    apart makes the result independent of the order of releases and placements.
    """

    def __init__(self, nodes: Mapping[str, NodeCapacity], reserve: float):
        alive = [n for n in nodes.values() if n.alive]
        self.nodes = {n.name: n for n in alive}
        self.base_cpu = {n.name: n.cpu_free for n in alive}
        self.base_mem = {n.name: n.mem_free for n in alive}
        self.taken_cpu = dict.fromkeys(self.nodes, 0.0)
        self.taken_mem = dict.fromkeys(self.nodes, 0.0)
        self.cpu_total = sum(n.cpu_total for n in alive)
        self.mem_total = sum(n.mem_total for n in alive)
        self.reserve = reserve

    def cpu_free(self, node: str) -> float:
        """Free cores on `node` now."""
        return self.base_cpu[node] - self.taken_cpu[node]

    def mem_free(self, node: str) -> float:
        """Free memory on `node` now."""
        return self.base_mem[node] - self.taken_mem[node]

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

    def best_node(self, cpu: float, mem: float, exclude: str | None) -> str | None:
        """The highest-Q alive node other than `exclude` with room for the demand."""
        ranked = sorted(self.nodes.values(), key=lambda n: (-n.score, n.name))
        for node in ranked:
            if node.name == exclude:
                continue
            if self.cpu_free(node.name) >= cpu and self.mem_free(node.name) >= mem:
                return node.name
        return None

    def take(self, node: str, cpu: float, mem: float) -> None:
        """Account for a standby placed on `node`."""
        self.taken_cpu[node] += cpu
        self.taken_mem[node] += mem

    def give(self, node: str, cpu: float, mem: float) -> None:
        """Account for a measured standby removed from `node` (dead nodes do not count)."""
        if node not in self.nodes:
            return
        self.base_cpu[node] = min(self.nodes[node].cpu_total, self.base_cpu[node] + cpu)
        self.base_mem[node] = min(self.nodes[node].mem_total, self.base_mem[node] + mem)

    def untake(self, node: str, cpu: float, mem: float) -> None:
        """Undo a `take` made earlier in this run."""
        self.taken_cpu[node] -= cpu
        self.taken_mem[node] -= mem


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
    """Result of Algorithm 1: operator -> standby node, plus the fallbacks with reasons."""

    standbys: dict[str, str] = field(default_factory=dict)
    fallbacks: tuple[Fallback, ...] = ()

    def to_dict(self) -> dict:
        """JSON-serialisable form."""
        return {
            "standbys": dict(self.standbys),
            "fallbacks": [f.to_dict() for f in self.fallbacks],
        }


def _by_priority(priorities: Sequence[OperatorPriority]) -> list[OperatorPriority]:
    # P_eff (priority raised by predicted fault risk) decides; the name breaks ties so the
    # result does not depend on input order.
    return sorted(priorities, key=lambda p: (-p.P_eff, p.name))


def _place_in_order(
    candidates: Sequence[OperatorPriority],
    primaries: Mapping[str, str],
    ledger: _Ledger,
) -> tuple[dict[str, str], list[Fallback]]:
    """Give each candidate (already sorted) the best node; stop at the reserve."""
    placed: dict[str, str] = {}
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
        node = ledger.best_node(op.cpu, op.mem, exclude=primary)
        if node is None:
            fallbacks.append(
                Fallback(
                    op.name,
                    f"no alive node other than primary {primary} has room for "
                    f"cpu {op.cpu:g}, mem {op.mem:g}",
                )
            )
            continue
        ledger.take(node, op.cpu, op.mem)
        placed[op.name] = node
    return placed, fallbacks


def place_standbys(
    priorities: Sequence[OperatorPriority],
    primaries: Mapping[str, str],
    nodes: Mapping[str, NodeCapacity],
    config: PolicyConfig,
) -> Placement:
    """Algorithm 1: initial standby placement.

    Active operators, by P_eff descending, each get the highest-Q alive node that is not their
    primary's node and has room for their demand, until the reserve would be crossed. Operators
    without a primary entry may go on any node.
    """
    ledger = _Ledger(nodes, config.resource_reserve)
    active = [p for p in _by_priority(priorities) if p.mode == ACTIVE]
    placed, fallbacks = _place_in_order(active, primaries, ledger)
    return Placement(standbys=placed, fallbacks=tuple(fallbacks))


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


def run_cycle(state: CycleInput, config: PolicyConfig) -> list[Action]:
    """Algorithm 2: one supervision cycle. Returns the actions to take; performs none.

    Steps: (1) rank alive nodes by fresh Q; (2) drop standbys of operators that are now passive
    or gone, move standbys off dead nodes and off their primary's node (drop them if no node can
    take them within the reserve); (3) if the cluster is below the reserve, drop standbys lowest
    P_eff first until it is not; (4) give active operators without a standby one, as Algorithm 1
    does; (5) set or adjust the checkpoint interval of every operator left without a standby.
    """
    by_name = {p.name: p for p in state.priorities}
    ledger = _Ledger(node_capacities(state.samples, config, state.alive), config.resource_reserve)
    actions: list[Action] = []
    standbys: dict[str, str] = {}
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
        if op.mode != ACTIVE:
            ledger.give(node, op.cpu, op.mem)
            actions.append(
                DropStandby(
                    name,
                    node,
                    f"now passive: P_eff {op.P_eff:.3f} <= threshold {config.priority_threshold:g}",
                )
            )
            touched.add(name)
            continue
        primary = state.primaries.get(name)
        if node in ledger.nodes and node != primary:
            standbys[name] = node
            continue
        why = (
            "its node is dead"
            if node not in ledger.nodes
            else f"it shares node {node} with its primary"
        )
        ledger.give(node, op.cpu, op.mem)
        target = (
            ledger.best_node(op.cpu, op.mem, exclude=primary)
            if ledger.keeps_reserve(op.cpu, op.mem)
            else None
        )
        touched.add(name)
        if target is None:
            actions.append(
                DropStandby(
                    name,
                    node,
                    f"{why} and no other node can take it within the reserve "
                    f"({ledger.describe(op.cpu, op.mem)})",
                )
            )
            continue
        ledger.take(target, op.cpu, op.mem)
        standbys[name] = target
        actions.append(MoveStandby(name, node, target, f"{why}; {target} has the best Q with room"))

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
            ledger.give(standbys[victim], op.cpu, op.mem)
            actions.append(DropStandby(victim, standbys[victim], reason))
        del standbys[victim]
        touched.add(victim)

    # Step 4: active operators without a standby, as in Algorithm 1.
    waiting = [
        p
        for p in _by_priority(state.priorities)
        if p.mode == ACTIVE and p.name not in standbys and p.name not in touched
    ]
    placed, fallbacks = _place_in_order(waiting, state.primaries, ledger)
    reasons = {f.operator: f.reason for f in fallbacks}
    for p in waiting:
        if p.name in placed:
            standbys[p.name] = placed[p.name]
            actions.append(
                AddStandby(
                    p.name,
                    placed[p.name],
                    f"active (P_eff {p.P_eff:.3f} > {config.priority_threshold:g}); "
                    f"{placed[p.name]} has the best Q with room",
                )
            )

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
    return actions
