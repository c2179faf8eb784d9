"""Planning a job's placement from the policy: where each stage's primary and standby run.

The policy scores operators; the data plane runs stages, cut by the strategy's chaining rule
(spark_runtime/strategies.py): one fused stage for restart-all, a stage per stateful operator for
local-restart, and for adaptive and active-all chained stages whose boundaries follow the
policy's protection (an active and a passive stateful operator never share a stage). A stage
gets a hot standby when the strategy says so: never for restart-all and local-restart, always
for active-all (the resource upper bound: the reserve is not kept), and for adaptive when one of
its operators is active and Algorithm 1 found it a node within the reserve. The standby goes
where Algorithm 1 put the stage's highest-priority active operator: a stage's protection follows
its highest-priority operator.

No Django imports: the controller feeds it plain data, tests call it directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from console.policy.checkpoint import initial_interval
from console.policy.config import PolicyConfig
from console.policy.placement import PLACED_AT_LAUNCH, StandbyVerdict, place_standbys
from console.policy.priority import ACTIVE, OperatorPriority, operator_priorities
from console.policy.resources import NodeSample, node_capacities, node_score
from spark_runtime.strategies import ALL_STANDBYS, POLICY_STANDBYS, STRATEGIES, get_strategy
from spark_runtime.topology import StageSpec, Topology, compile_stages


@dataclass(frozen=True)
class StagePlan:
    """One stage: its operators, the node of its primary and of its standby (None: no standby),
    and for a standby why it sits there (a `StandbyVerdict`)."""

    name: str
    operators: tuple[str, ...]
    primary_node: str
    standby_node: str | None
    reason: str
    standby_verdict: StandbyVerdict | None = None


@dataclass
class JobPlan:
    """Everything the controller needs to launch a job and show why it is placed that way."""

    strategy: str
    priorities: list[OperatorPriority]
    intervals: dict[str, float]
    stages: list[StagePlan]
    node_scores: dict[str, float]
    fallbacks: list[dict] = field(default_factory=list)

    def primary_demands(self) -> dict[str, tuple[float, float]]:
        """node -> (cpu, mem) the plan's primaries will use there: their operators' demand."""
        by_operator = {p.name: p for p in self.priorities}
        return primary_demands(((s.primary_node, s.operators) for s in self.stages), by_operator)

    def stage(self, name: str) -> StagePlan:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)


def rank_nodes(history: Mapping[str, Sequence[NodeSample]], config: PolicyConfig) -> list[str]:
    """Alive nodes (those with samples) by Q descending, name breaking ties."""
    scores = {name: node_score(samples, config) for name, samples in history.items() if samples}
    return sorted(scores, key=lambda name: (-scores[name], name))


def plan_job(
    topology: Topology,
    strategy: str,
    history: Mapping[str, Sequence[NodeSample]],
    config: PolicyConfig,
    fault_rates: Mapping[str, float] | None = None,
) -> JobPlan:
    """Plan a job on the nodes in `history` (node -> recent samples, newest first).

    Raises ValueError when no node is alive or the strategy is unknown.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy: must be one of {', '.join(STRATEGIES)}")
    ranked = rank_nodes(history, config)
    if not ranked:
        raise ValueError("no node is alive: start the node agents first")
    newest = [history[name][0] for name in ranked]
    cluster_cpu = sum(s.cpu_total for s in newest)
    cluster_mem = sum(s.mem_total for s in newest)
    priorities = operator_priorities(
        topology, cluster_cpu, cluster_mem, config, fault_rates=fault_rates
    )
    by_operator = {p.name: p for p in priorities}
    definition = get_strategy(strategy)
    if definition.standbys == ALL_STANDBYS:
        protected = {p.name for p in priorities}
    elif definition.standbys == POLICY_STANDBYS:
        protected = {p.name for p in priorities if p.mode == ACTIVE}
    else:
        protected = set()
    stages = compile_stages(topology, definition.chaining, active=protected)
    primaries = _place_primaries(stages, by_operator, ranked)
    operator_primary = {op: primaries[s.name] for s in stages for op in s.operators}
    scores = {name: node_score(history[name], config) for name in ranked}

    fallbacks: list[dict] = []
    standby_nodes: dict[str, str | None] = {s.name: None for s in stages}
    reasons: dict[str, str] = {s.name: f"{strategy}: checkpoints only" for s in stages}
    verdicts: dict[str, StandbyVerdict] = {}
    if definition.standbys == ALL_STANDBYS:
        for stage in stages:
            others = [n for n in ranked if n != primaries[stage.name]]
            standby_nodes[stage.name] = others[0] if others else None
            reasons[stage.name] = (
                f"active-all: standby on {others[0]}, the best Q besides the primary"
                if others
                else "active-all: no second node for a standby"
            )
            if others:
                verdicts[stage.name] = StandbyVerdict(
                    stage.name,
                    others[0],
                    PLACED_AT_LAUNCH,
                    f"{PLACED_AT_LAUNCH}: {reasons[stage.name]}",
                    "not checked: active-all gives every stage a standby",
                )
    elif definition.standbys == POLICY_STANDBYS:
        staged = [by_operator[op] for s in stages for op in s.operators]
        # The primaries are not running yet, so the samples do not show them: Algorithm 1 charges
        # them to their nodes, or a standby could land on a node the plan already loads.
        planned = primary_demands(((primaries[s.name], s.operators) for s in stages), by_operator)
        placement = place_standbys(
            staged, operator_primary, node_capacities(history, config), config, planned
        )
        fallbacks = [f.to_dict() for f in placement.fallbacks]
        for stage in stages:
            active = sorted(
                (by_operator[op] for op in stage.operators if by_operator[op].mode == ACTIVE),
                key=lambda p: -p.P_eff,
            )
            placed = [p for p in active if p.name in placement.standbys]
            if placed:
                node = placement.standbys[placed[0].name]
                standby_nodes[stage.name] = node
                verdicts[stage.name] = placement.verdicts[placed[0].name]
                reasons[stage.name] = (
                    f"{placed[0].name} is active (P_eff {placed[0].P_eff:.3f} > "
                    f"{config.priority_threshold:g}); Algorithm 1: {verdicts[stage.name].reason}"
                )
            elif active:
                why = next((f["reason"] for f in fallbacks if f["operator"] == active[0].name), "")
                reasons[stage.name] = f"{active[0].name} is active but fell back: {why}"
            else:
                reasons[stage.name] = "every operator is passive: checkpoints only"

    intervals = {
        p.name: initial_interval(p.fr, config) for p in priorities if p.name in operator_primary
    }
    plans = [
        StagePlan(
            name=s.name,
            operators=s.operators,
            primary_node=primaries[s.name],
            standby_node=standby_nodes[s.name],
            reason=reasons[s.name],
            standby_verdict=verdicts.get(s.name),
        )
        for s in stages
    ]
    return JobPlan(strategy, priorities, intervals, plans, scores, fallbacks)


def primary_demands(
    placed: Iterable[tuple[str, Sequence[str]]], by_operator: Mapping[str, OperatorPriority]
) -> dict[str, tuple[float, float]]:
    """node -> (cpu, mem) summed over the operators of the stages whose primaries `placed` puts
    there ((node, operators) per stage)."""
    planned: dict[str, tuple[float, float]] = {}
    for node, operators in placed:
        cpu, mem = planned.get(node, (0.0, 0.0))
        planned[node] = (
            cpu + sum(by_operator[op].cpu for op in operators),
            mem + sum(by_operator[op].mem for op in operators),
        )
    return planned


def _place_primaries(
    stages: Sequence[StageSpec], by_operator: Mapping[str, OperatorPriority], ranked: list[str]
) -> dict[str, str]:
    """Heaviest stage (by summed demand) on the best node, the next on the next, round-robin."""
    weight = {
        s.name: sum(by_operator[op].cpu + by_operator[op].mem / 1024 for op in s.operators)
        for s in stages
    }
    ordered = sorted(stages, key=lambda s: (-weight[s.name], s.name))
    return {stage.name: ranked[i % len(ranked)] for i, stage in enumerate(ordered)}
