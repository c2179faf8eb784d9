"""Operator fault-tolerance priority P_i = w1*S_i + w2*R_i + w3*L_i (Da-Stream).

S_i is the type score, R_i the resource score (demand over cluster totals), L_i the dependency
strength (in plus out degree over the largest degree in the topology). The predicted fault rate
fr raises the effective priority: P_eff = min(1, P + fault_risk_weight * fr), so an operator
that keeps failing earns a standby even if its type alone would not.

An operator's demand is its declared estimate (the topology's, or a user job's `cpu`/`mem`)
until its stage runs; from then on the controller passes what the stage's process uses
(`measured_demands`), so a user operator that turns out heavier than declared scores higher.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from console.policy.config import PolicyConfig
from console.policy.spares import SPARE_CPU, SPARE_MEM_MB
from spark_runtime.topology import Topology

ACTIVE = "active"
PASSIVE = "passive"

# Da-Stream's type scores: stateless 0.1, aggregation 0.5, join and other stateful 0.8.
TYPE_SCORES: dict[str, float] = {
    "source": 0.1,
    "map": 0.1,
    "filter": 0.1,
    "flatmap": 0.1,
    "sink": 0.1,
    "aggregate": 0.5,
    "join": 0.8,
    "window_aggregate": 0.8,
    "topn": 0.8,
    "stateful": 0.8,
}


@dataclass(frozen=True)
class OperatorPriority:
    """The priority of one operator with every term, so the console can show its reasoning."""

    name: str
    kind: str
    S: float
    R: float
    L: float
    P: float
    fr: float
    P_eff: float
    mode: str
    cpu: float
    mem: float
    explain: str
    demand_source: str = "estimated"  # or "measured" (see measured_demands)

    def to_dict(self) -> dict:
        """All fields as a JSON-serialisable dict."""
        return asdict(self)


def type_score(kind: str) -> float:
    """S_i for an operator kind; raises KeyError for an unknown kind."""
    return TYPE_SCORES[kind]


def resource_score(
    cpu: float, mem: float, cpu_total: float, mem_total: float, config: PolicyConfig
) -> float:
    """R_i = alpha*cpu/C + beta*mem/M, clamped to [0, 1]. Cluster totals must be positive."""
    if cpu_total <= 0 or mem_total <= 0:
        raise ValueError(f"cluster totals must be positive (cpu={cpu_total}, mem={mem_total})")
    r = config.alpha_cpu * cpu / cpu_total + config.beta_mem * mem / mem_total
    return min(1.0, max(0.0, r))


def measured_demands(
    topology: Topology,
    stage_operators: Mapping[str, Sequence[str]],
    stage_usage: Mapping[str, tuple[float, float]],
) -> dict[str, dict[str, float]]:
    """Each operator's measured demand ({"cpu": cores, "mem": MiB}) from `stage_usage` (stage ->
    (averaged CPU, RSS in MiB) of its primary's process tree): what the stage uses beyond an idle
    stage process (a warm spare's footprint: Python, JVM and SparkSession with no query), split
    among the stage's operators in proportion to their estimates. Operators of stages not in
    `stage_usage` are left out (they keep their estimates)."""
    demands: dict[str, dict[str, float]] = {}
    for stage, (cpu, mem) in stage_usage.items():
        operators = [topology.operator(name) for name in stage_operators.get(stage, ())]
        own = {"cpu": max(0.0, cpu - SPARE_CPU), "mem": max(0.0, mem - SPARE_MEM_MB)}
        for resource, used in own.items():
            estimates = {op.name: getattr(op, resource) for op in operators}
            total = sum(estimates.values())
            for name, estimate in estimates.items():
                share = estimate / total if total > 0 else 1 / len(estimates)
                demands.setdefault(name, {})[resource] = round(used * share, 3)
    return demands


def dependency_scores(topology: Topology) -> dict[str, float]:
    """L_i = (N_pred_i + N_succ_i) / max_j(N_pred_j + N_succ_j); 0 for all when no edges."""
    degree = {
        op.name: len(op.upstream) + len(topology.downstream(op.name)) for op in topology.operators
    }
    top = max(degree.values(), default=0)
    return {name: (d / top if top else 0.0) for name, d in degree.items()}


def priority_score(s: float, r: float, lval: float, config: PolicyConfig) -> float:
    """P = w_type*S + w_resource*R + w_dependency*L."""
    return config.w_type * s + config.w_resource * r + config.w_dependency * lval


def effective_priority(p: float, fr: float, config: PolicyConfig) -> float:
    """P_eff = min(1, P + fault_risk_weight * fr)."""
    return min(1.0, p + config.fault_risk_weight * fr)


def operator_priorities(
    topology: Topology,
    cluster_cpu: float,
    cluster_mem: float,
    config: PolicyConfig,
    demands: Mapping[str, Mapping[str, float]] | None = None,
    fault_rates: Mapping[str, float] | None = None,
) -> list[OperatorPriority]:
    """Score every operator of `topology`, in topological order.

    `demands` overrides an operator's estimated demand ({"cpu": cores, "mem": MiB}, either key
    optional; the controller passes `measured_demands`); `fault_rates` gives fr per operator
    (missing operators use config.fault_rate_prior).
    Unknown operator names in either mapping raise KeyError: a typo must not pass silently.
    """
    demands = demands or {}
    fault_rates = fault_rates or {}
    known = {op.name for op in topology.operators}
    for label, mapping in (("demands", demands), ("fault_rates", fault_rates)):
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise KeyError(f"{label}: unknown operators {unknown} in topology {topology.name!r}")

    dependency = dependency_scores(topology)
    results = []
    for op in topology.topological_order():
        override = demands.get(op.name, {})
        source = "measured" if override else "estimated"
        cpu = float(override.get("cpu", op.cpu))
        mem = float(override.get("mem", op.mem))
        s = type_score(op.kind)
        r = resource_score(cpu, mem, cluster_cpu, cluster_mem, config)
        lval = dependency[op.name]
        p = priority_score(s, r, lval, config)
        fr = float(fault_rates.get(op.name, config.fault_rate_prior))
        p_eff = effective_priority(p, fr, config)
        mode = ACTIVE if p_eff > config.priority_threshold else PASSIVE
        explain = (
            f"S={s:.3f} (kind {op.kind}); "
            f"R={config.alpha_cpu:g}*{cpu:g}/{cluster_cpu:g} + {config.beta_mem:g}*{mem:g}/"
            f"{cluster_mem:g} = {r:.3f} ({source} demand); "
            f"L={lval:.3f} (in {len(op.upstream)} + out {len(topology.downstream(op.name))}); "
            f"P={config.w_type:g}*{s:.3f} + {config.w_resource:g}*{r:.3f} + "
            f"{config.w_dependency:g}*{lval:.3f} = {p:.3f}; "
            f"P_eff=min(1, {p:.3f} + {config.fault_risk_weight:g}*{fr:.3f}) = {p_eff:.3f} "
            f"{'>' if mode == ACTIVE else '<='} threshold {config.priority_threshold:g} -> {mode}"
        )
        results.append(
            OperatorPriority(
                name=op.name,
                kind=op.kind,
                S=s,
                R=r,
                L=lval,
                P=p,
                fr=fr,
                P_eff=p_eff,
                mode=mode,
                cpu=cpu,
                mem=mem,
                explain=explain,
                demand_source=source,
            )
        )
    return results
