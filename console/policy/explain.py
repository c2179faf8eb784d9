"""Dry run of the policy for one topology on a described cluster (behind `policy_explain`).

Kept free of Django so it can be tested and reused by the console without a database. Input
formats (docs/POLICY.md has examples):

- nodes: a list of objects with name, cpu_total, cpu_used, mem_total, mem_used, disk_throughput,
  disk_max_throughput, bw_used, bw_total (the newest sample) and an optional `history`: older
  samples of the same shape (without name), newest first. Q uses the top-level sample as k=0
  and the history as k=1, 2, ...
- operators: {operator name: {"cpu": cores, "mem": MiB}}, either key optional.

Primary placement for the dry run: operators, in topological order, are dealt round-robin over
the nodes sorted by Q (highest first; ties by name), so the best node gets the first operator,
the next node the second, and so on. Their demand is then charged to those nodes before the
standbys are placed (`place_standbys(planned=...)`, as a launch does), since the dry run imagines
the job deployed on top of the load the file describes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from console.policy.checkpoint import initial_interval
from console.policy.config import PolicyConfig
from console.policy.placement import place_standbys
from console.policy.priority import operator_priorities
from console.policy.resources import NodeSample, idle_rates, node_capacities
from infra.node_metrics import RESOURCE_FIELDS
from spark_runtime.topology import Topology


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{where} must be >= 0, got {value!r}")
    return float(value)


def _sample(name: str, data: object, where: str) -> NodeSample:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be an object")
    missing = [f for f in RESOURCE_FIELDS if f not in data]
    if missing:
        raise ValueError(f"{where} is missing {', '.join(missing)}")
    values = {f: _number(data[f], f"{where}.{f}") for f in RESOURCE_FIELDS}
    return NodeSample(name=name, **values)


def parse_nodes(data: object) -> dict[str, list[NodeSample]]:
    """Validate the nodes document; returns node name -> samples, newest first.

    Raises ValueError naming the node (by index and name) and the field.
    """
    if not isinstance(data, list) or not data:
        raise ValueError("top level must be a non-empty list of node objects")
    result: dict[str, list[NodeSample]] = {}
    allowed = {"name", "history", *RESOURCE_FIELDS}
    for i, node in enumerate(data):
        where = f"node {i}"
        if not isinstance(node, dict):
            raise ValueError(f"{where} must be an object")
        name = node.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name must be a non-empty string")
        where = f"node {i} ({name!r})"
        if name in result:
            raise ValueError(f"{where}: duplicate node name")
        unknown = sorted(set(node) - allowed)
        if unknown:
            raise ValueError(f"{where}: unknown fields {unknown}")
        history = node.get("history", [])
        if not isinstance(history, list):
            raise ValueError(f"{where}.history must be a list of samples")
        samples = [_sample(name, node, where)]
        samples += [_sample(name, h, f"{where}.history[{k}]") for k, h in enumerate(history)]
        result[name] = samples
    return result


def parse_operators(data: object, topology: Topology) -> dict[str, dict[str, float]]:
    """Validate the operators document against `topology`; returns demand overrides."""
    if not isinstance(data, dict):
        raise ValueError("top level must be an object mapping operator name -> {cpu, mem}")
    known = {op.name for op in topology.operators}
    result: dict[str, dict[str, float]] = {}
    for name, demand in data.items():
        if name not in known:
            raise ValueError(
                f"operator {name!r} is not in topology {topology.name!r} {sorted(known)}"
            )
        if not isinstance(demand, dict) or set(demand) - {"cpu", "mem"}:
            raise ValueError(f"operator {name!r} must be an object with only 'cpu' and/or 'mem'")
        result[name] = {k: _number(v, f"operator {name!r}.{k}") for k, v in demand.items()}
    return result


def explain(
    topology: Topology,
    nodes: Mapping[str, list[NodeSample]],
    config: PolicyConfig,
    demands: Mapping[str, Mapping[str, float]] | None = None,
) -> dict:
    """Score, place and set intervals for `topology` on `nodes`; a JSON-serialisable report."""
    capacities = node_capacities(nodes, config)
    cluster_cpu = sum(samples[0].cpu_total for samples in nodes.values())
    cluster_mem = sum(samples[0].mem_total for samples in nodes.values())
    priorities = operator_priorities(topology, cluster_cpu, cluster_mem, config, demands)

    ranked = sorted(capacities.values(), key=lambda n: (-n.score, n.name))
    primaries = {p.name: ranked[i % len(ranked)].name for i, p in enumerate(priorities)}
    planned = {node.name: (0.0, 0.0) for node in ranked}
    for p in priorities:
        cpu, mem = planned[primaries[p.name]]
        planned[primaries[p.name]] = (cpu + p.cpu, mem + p.mem)
    placement = place_standbys(priorities, primaries, capacities, config, planned)
    fallbacks = {f.operator: f.reason for f in placement.fallbacks}

    operators = []
    for p in priorities:
        verdict = placement.verdicts.get(p.name)
        operators.append(
            {
                **p.to_dict(),
                "primary": primaries[p.name],
                "standby": placement.standbys.get(p.name),
                "standby_reason": verdict.reason if verdict else None,
                "fallback": fallbacks.get(p.name),
                "checkpoint_interval_s": initial_interval(p.fr, config),
            }
        )
    node_rows = []
    for node in ranked:
        idle = idle_rates(nodes[node.name][0])
        node_rows.append(
            {
                "name": node.name,
                "Q": node.score,
                "samples": min(len(nodes[node.name]), config.q_samples),
                "cpu_idle": idle.cpu,
                "mem_idle": idle.mem,
                "disk_idle": idle.disk,
                "bw_idle": idle.bw,
                "cpu_free_after_primaries": max(0.0, node.cpu_free - planned[node.name][0]),
                "mem_free_after_primaries": max(0.0, node.mem_free - planned[node.name][1]),
            }
        )
    return {
        "topology": topology.name,
        "cluster": {"cpu_total": cluster_cpu, "mem_total": cluster_mem},
        "operators": operators,
        "nodes": node_rows,
    }


def format_table(report: dict) -> str:
    """The report as two aligned text tables (operators, then nodes)."""
    op_header = (
        "operator",
        "kind",
        "S",
        "R",
        "L",
        "P",
        "P_eff",
        "mode",
        "primary",
        "standby",
        "CI s",
    )
    op_rows = [
        (
            o["name"],
            o["kind"],
            f"{o['S']:.3f}",
            f"{o['R']:.3f}",
            f"{o['L']:.3f}",
            f"{o['P']:.3f}",
            f"{o['P_eff']:.3f}",
            o["mode"],
            o["primary"],
            o["standby"] or "-",
            f"{o['checkpoint_interval_s']:.1f}",
        )
        for o in report["operators"]
    ]
    node_header = ("node", "Q", "cpu_idle", "mem_idle", "disk_idle", "bw_idle", "samples")
    node_rows = [
        (
            n["name"],
            f"{n['Q']:.3f}",
            f"{n['cpu_idle']:.2f}",
            f"{n['mem_idle']:.2f}",
            f"{n['disk_idle']:.2f}",
            f"{n['bw_idle']:.2f}",
            str(n["samples"]),
        )
        for n in report["nodes"]
    ]
    lines = [f"topology {report['topology']}", ""]
    lines += _aligned(op_header, op_rows)
    notes = [f"  {o['name']}: {o['fallback']}" for o in report["operators"] if o["fallback"]]
    if notes:
        lines += ["", "active operators left passive:", *notes]
    lines.append("")
    lines += _aligned(node_header, node_rows)
    return "\n".join(lines)


def _aligned(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    return [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
