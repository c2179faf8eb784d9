"""Node idle rates, the decayed node score Q and cluster utilisation (Da-Stream).

Units are whatever the node agents report, as long as they are consistent: cpu in cores, memory
in MiB (the unit of `OperatorSpec.mem`), disk throughput and bandwidth in any rate unit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from console.policy.config import PolicyConfig
from infra.node_metrics import Resources


@dataclass(frozen=True)
class NodeSample(Resources):
    """One resource sample of one node, as a node agent reports it: `NodeSample(name,
    cpu_total=..., ...)` with the figures of infra.node_metrics.Resources (RESOURCE_FIELDS)."""

    name: str

    @property
    def cpu_free(self) -> float:
        """Free cores (never negative)."""
        return max(0.0, self.cpu_total - self.cpu_used)

    @property
    def mem_free(self) -> float:
        """Free memory (never negative)."""
        return max(0.0, self.mem_total - self.mem_used)


@dataclass(frozen=True)
class IdleRates:
    """Idle fractions of one sample, each in [0, 1]."""

    cpu: float
    mem: float
    disk: float
    bw: float


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, x))


def _idle(used: float, total: float) -> float:
    # A resource with no capacity has nothing idle to offer; avoid dividing by zero.
    if total <= 0:
        return 0.0
    return _clamp01(1.0 - used / total)


def idle_rates(sample: NodeSample) -> IdleRates:
    """cpu_idle=(total-used)/total, mem_idle likewise, disk_idle=1-throughput/max,
    bw_idle=1-used/total; each clamped to [0, 1], and 0 when the total is 0."""
    return IdleRates(
        cpu=_idle(sample.cpu_used, sample.cpu_total),
        mem=_idle(sample.mem_used, sample.mem_total),
        disk=_idle(sample.disk_throughput, sample.disk_max_throughput),
        bw=_idle(sample.bw_used, sample.bw_total),
    )


def instant_score(rates: IdleRates, config: PolicyConfig) -> float:
    """w1*cpu_idle + w2*mem_idle + w3*disk_idle + w4*bw_idle for one sample."""
    return (
        config.q_w_cpu * rates.cpu
        + config.q_w_mem * rates.mem
        + config.q_w_disk * rates.disk
        + config.q_w_bw * rates.bw
    )


def _decay_weights(n: int, config: PolicyConfig) -> list[float]:
    return [math.exp(-config.q_decay_lambda * k) for k in range(n)]


def q_scale(config: PolicyConfig) -> float:
    """The highest Q a node can have: sum_{k=0..q_samples-1} exp(-lambda*k), the Q of a node
    idle on every resource in each counted sample (2.33 with the defaults). Q lies in [0, this]."""
    return sum(_decay_weights(config.q_samples, config))


def node_score(samples: Sequence[NodeSample], config: PolicyConfig) -> float:
    """Q_i(t) = sum_{k=0..n-1} exp(-lambda*k) * instant_score(sample_k), newest first (k=0).

    Only the newest `config.q_samples` samples count. A node with fewer samples so far (an agent
    that just started) has its sum scaled by q_scale / (sum of its own weights), as if each missing
    older sample had scored its weighted mean: unscaled, an idle node would rank below a busier
    one only for being younger. So Q always lies in [0, q_scale]. An empty history scores 0 (an
    unknown node is never preferred).
    """
    recent = list(samples)[: config.q_samples]
    if not recent:
        return 0.0
    weights = _decay_weights(len(recent), config)
    decayed = sum(
        w * instant_score(idle_rates(s), config) for w, s in zip(weights, recent, strict=True)
    )
    return decayed * q_scale(config) / sum(weights)


@dataclass(frozen=True)
class ClusterRates:
    """Rate_cpu = sum used / sum total, Rate_mem likewise (0 for an empty cluster)."""

    cpu: float
    mem: float


def cluster_rates(samples: Sequence[NodeSample]) -> ClusterRates:
    """Cluster utilisation from one (normally the newest) sample per node."""
    cpu_total = sum(s.cpu_total for s in samples)
    mem_total = sum(s.mem_total for s in samples)
    return ClusterRates(
        cpu=_clamp01(sum(s.cpu_used for s in samples) / cpu_total) if cpu_total > 0 else 0.0,
        mem=_clamp01(sum(s.mem_used for s in samples) / mem_total) if mem_total > 0 else 0.0,
    )


@dataclass(frozen=True)
class NodeCapacity:
    """What placement needs to know about a node: totals, free resources now, and its Q."""

    name: str
    cpu_total: float
    mem_total: float
    cpu_free: float
    mem_free: float
    score: float
    alive: bool = True


def q_after(node: NodeCapacity, cpu: float, mem: float, config: PolicyConfig) -> float:
    """Estimated Q of `node` once `cpu` more cores and `mem` more MiB are in use (negative values:
    freed). Every counted sample's cpu_idle falls by cpu/cpu_total and its mem_idle by
    mem/mem_total, so Q falls by q_scale * (q_w_cpu*cpu/cpu_total + q_w_mem*mem/mem_total).
    Not clamped to [0, q_scale]: it only compares nodes, and clamping would make unequal loads tie.
    """
    scale = q_scale(config)
    cpu_share = cpu / node.cpu_total if node.cpu_total > 0 else 0.0
    mem_share = mem / node.mem_total if node.mem_total > 0 else 0.0
    return node.score - scale * (config.q_w_cpu * cpu_share + config.q_w_mem * mem_share)


def node_capacities(
    history: Mapping[str, Sequence[NodeSample]],
    config: PolicyConfig,
    alive: Mapping[str, bool] | None = None,
) -> dict[str, NodeCapacity]:
    """Build NodeCapacity per node from its samples (newest first); free figures come from the
    newest sample. Nodes without samples are skipped. Without `alive` every node counts as alive;
    with it, a node missing from the mapping counts as dead."""
    result: dict[str, NodeCapacity] = {}
    for name, samples in history.items():
        if not samples:
            continue
        newest = samples[0]
        result[name] = NodeCapacity(
            name=name,
            cpu_total=newest.cpu_total,
            mem_total=newest.mem_total,
            cpu_free=newest.cpu_free,
            mem_free=newest.mem_free,
            score=node_score(samples, config),
            alive=True if alive is None else bool(alive.get(name, False)),
        )
    return result
