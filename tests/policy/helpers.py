"""Builders shared by the policy tests (no database, no Django)."""

from __future__ import annotations

from console.policy.priority import ACTIVE, PASSIVE, OperatorPriority
from console.policy.resources import NodeSample


def make_priority(
    name: str, p_eff: float, cpu: float = 0.5, mem: float = 500.0, active: bool = True, fr=0.05
) -> OperatorPriority:
    """An OperatorPriority with only the fields placement looks at filled in meaningfully."""
    return OperatorPriority(
        name=name,
        kind="aggregate",
        S=0.5,
        R=0.0,
        L=0.0,
        P=p_eff,
        fr=fr,
        P_eff=p_eff,
        mode=ACTIVE if active else PASSIVE,
        cpu=cpu,
        mem=mem,
        explain="test",
    )


def make_sample(
    name: str,
    cpu_total: float = 4.0,
    cpu_used: float = 0.0,
    mem_total: float = 4000.0,
    mem_used: float = 0.0,
    disk: float = 0.0,
    disk_max: float = 100.0,
    bw: float = 0.0,
    bw_total: float = 100.0,
) -> NodeSample:
    """A NodeSample with idle disk and network unless told otherwise."""
    return NodeSample(
        name,
        cpu_total=cpu_total,
        cpu_used=cpu_used,
        mem_total=mem_total,
        mem_used=mem_used,
        disk_throughput=disk,
        disk_max_throughput=disk_max,
        bw_used=bw,
        bw_total=bw_total,
    )
