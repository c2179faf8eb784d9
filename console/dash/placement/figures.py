"""Placement charts and tables: idle rates per node against the reserve, the node queue by Q,
what Q's scale is, and why each standby sits where it is."""

from __future__ import annotations

import math
from collections.abc import Mapping

import plotly.graph_objects as go

from console.dash.common import BASE_LAYOUT, FAULT, GRID, OK, PASSIVE, series_colour
from console.policy.config import PolicyConfig
from console.policy.resources import q_scale

IDLE_BARS = (
    ("cpu_idle", "CPU idle"),
    ("mem_idle", "memory idle"),
    ("disk_idle", "disk idle"),
    ("bw_idle", "bandwidth idle"),
)
# Up to this many nodes the idle rates are grouped bars and Q horizontal bars; beyond, a heatmap
# (a column per node) and vertical bars: 4 bars x 50 nodes cannot be read.
MAX_BAR_NODES = 12


def by_q(nodes: list[dict]) -> list[dict]:
    """Nodes in the policy's queue order: highest Q first, nodes without a Q last."""
    return sorted(nodes, key=lambda n: (n["q_score"] is None, -(n["q_score"] or 0.0), n["name"]))


def cluster_free(nodes: list[dict]) -> dict[str, float | None]:
    """Free share of the cluster's CPU and memory: 1 - sum(used) / sum(total), from the latest
    utilisation of each node that reported one."""
    free = {}
    for util, total in (("cpu_util", "cpu_total"), ("mem_util", "mem_total_mb")):
        reporting = [n for n in nodes if n[util] is not None]
        capacity = sum(n[total] for n in reporting)
        used = sum(n[util] * n[total] for n in reporting)
        free[util.split("_")[0]] = 1 - used / capacity if capacity else None
    return free


def idle_figure(nodes: list[dict], reserve: float) -> go.Figure:
    """Idle rates of each node (grouped bars, nodes by Q) and the free share of the whole cluster
    (hatched CPU and memory bars), with the reserve as a horizontal line: the policy stops
    placing standbys when the cluster's free share would fall below it. Beyond MAX_BAR_NODES
    nodes, `idle_heatmap`."""
    if len(nodes) > MAX_BAR_NODES:
        return idle_heatmap(nodes, reserve)
    ordered = by_q(nodes)
    names = [n["name"] for n in ordered] + ["cluster"]
    free = cluster_free(nodes)
    cluster_values = {"cpu_idle": free["cpu"], "mem_idle": free["mem"]}
    fig = go.Figure()
    for index, (key, label) in enumerate(IDLE_BARS):
        values = [n[key] for n in ordered] + [cluster_values.get(key)]
        fig.add_trace(
            go.Bar(
                x=names,
                y=[None if v is None else v * 100 for v in values],
                name=label,
                marker_color=series_colour(index),
                # The cluster bars are hatched: they are sums over nodes, not one node.
                marker_pattern_shape=[""] * len(ordered) + ["/"],
            )
        )
    fig.add_hline(
        y=reserve * 100,
        line={"dash": "dash", "color": FAULT, "width": 2},
        annotation_text=f"reserve {reserve * 100:.0f}%",
        annotation_position="top left",
        annotation_font_color=FAULT,
        annotation_bgcolor="rgba(255,255,255,0.85)",
    )
    fig.update_layout(
        **{**BASE_LAYOUT, "hovermode": "closest"},
        title={"text": "Idle rates (nodes in queue order by Q; hatched: whole cluster)", "x": 0.01},
        barmode="group",
        yaxis={"title": "% idle", "range": [0, 100], **GRID},
        uirevision="idle",
        height=340,
    )
    return fig


def idle_heatmap(nodes: list[dict], reserve: float) -> go.Figure:
    """Idle rates at fleet size: a row per resource, a column per node in queue order by Q and
    a last column for the whole cluster; red below the reserve, amber just above it, green when
    idle. Each cell holds the idle percentage."""
    ordered = by_q(nodes)
    names = [n["name"] for n in ordered] + ["cluster"]
    free = cluster_free(nodes)
    cluster_values = {"cpu_idle": free["cpu"], "mem_idle": free["mem"]}
    z = [
        [None if n[key] is None else n[key] * 100 for n in ordered]
        + [None if cluster_values.get(key) is None else cluster_values[key] * 100]
        for key, _ in IDLE_BARS
    ]
    low = min(max(reserve, 0.0), 0.98)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=names,
            y=[label for _, label in IDLE_BARS],
            zmin=0,
            zmax=100,
            colorscale=[
                [0.0, FAULT],
                [low, "#f6b26b"],
                [min(1.0, low + 0.02), "#fde9a9"],
                [1.0, OK],
            ],
            xgap=2,
            ygap=2,
            texttemplate="%{z:.0f}",
            textfont={"size": 10},
            colorbar={"title": {"text": "% idle"}, "thickness": 12},
            hovertemplate="%{x}: %{y} %{z:.0f}%<extra></extra>",
        )
    )
    fig.update_layout(
        **{**BASE_LAYOUT, "hovermode": "closest", "margin": {"l": 110, "r": 16, "t": 36, "b": 90}},
        title={
            "text": f"Idle rates, % (columns: nodes in queue order by Q, then the whole cluster;"
            f" red: below the reserve {reserve * 100:.0f}%)",
            "x": 0.01,
        },
        xaxis={"tickangle": -60, "type": "category"},
        yaxis={"autorange": "reversed"},
        uirevision="idle",
        height=330,
    )
    return fig


def q_figure(nodes: list[dict], scale: float) -> go.Figure:
    """Resource score Q per node, highest first (the order standbys are placed in), on its full
    range [0, scale] with the top of the scale (idle on every resource) marked. Beyond
    MAX_BAR_NODES nodes the bars stand upright, nodes left to right."""
    ordered = [n for n in by_q(nodes) if n["q_score"] is not None]
    if len(nodes) > MAX_BAR_NODES:
        return _q_columns(ordered, scale)
    fig = go.Figure(
        go.Bar(
            x=[n["q_score"] for n in ordered],
            y=[n["name"] for n in ordered],
            orientation="h",
            marker_color=[OK if n["state"] == "up" else FAULT for n in ordered],
            text=[f"{n['q_score']:.2f}" for n in ordered],
            textposition="auto",
        )
    )
    fig.add_vline(
        x=scale,
        line={"dash": "dot", "color": PASSIVE, "width": 1},
        annotation_text=f"fully idle {scale:.2f}",
        annotation_position="top left",
    )
    fig.update_layout(
        **{**BASE_LAYOUT, "hovermode": "closest"},
        title={"text": f"Resource score Q (0 = fully busy, {scale:.2f} = fully idle)", "x": 0.01},
        yaxis={"autorange": "reversed"},
        xaxis={"title": "Q", "range": [0, scale * 1.05], **GRID},
        uirevision="q",
        height=340,
    )
    return fig


def _q_columns(ordered: list[dict], scale: float) -> go.Figure:
    """Q of many nodes: one column each, in queue order from the left."""
    fig = go.Figure(
        go.Bar(
            x=[n["name"] for n in ordered],
            y=[n["q_score"] for n in ordered],
            marker_color=[OK if n["state"] == "up" else FAULT for n in ordered],
            hovertemplate="%{x}: Q %{y:.2f}<extra></extra>",
        )
    )
    fig.add_hline(
        y=scale,
        line={"dash": "dot", "color": PASSIVE, "width": 1},
        annotation_text=f"fully idle {scale:.2f}",
        annotation_position="top right",
    )
    fig.update_layout(
        **{**BASE_LAYOUT, "hovermode": "closest", "margin": {"l": 56, "r": 16, "t": 36, "b": 90}},
        title={
            "text": f"Resource score Q, queue order from the left (0 = fully busy, {scale:.2f} = "
            "fully idle; red: node not up)",
            "x": 0.01,
        },
        xaxis={"tickangle": -60, "type": "category"},
        yaxis={"title": "Q", "range": [0, scale * 1.08], **GRID},
        uirevision="q",
        height=330,
    )
    return fig


def q_scale_note(values: Mapping[str, float]) -> str:
    """What Q's numbers mean under the policy `values` (every PolicyConfig field): the sum it is,
    and its range, so a Q above 1 reads as what it is."""
    config = PolicyConfig(**values)
    weights = ", ".join(
        f"{math.exp(-config.q_decay_lambda * k):.2g}" for k in range(config.q_samples)
    )
    scale = q_scale(config)
    return (
        f"Q is how idle a node has been lately. Each of its newest {config.q_samples} samples "
        f"scores {config.q_w_cpu:g}·CPU idle + {config.q_w_mem:g}·memory idle + "
        f"{config.q_w_disk:g}·disk idle + {config.q_w_bw:g}·bandwidth idle, between 0 (fully "
        f"busy) and 1 (fully idle); Q adds these scores up, newest first, weighted {weights} "
        f"(decay λ = {config.q_decay_lambda:g}). So Q runs from 0 to {scale:.2f}: "
        f"{scale:.2f} is a node idle on every resource in all {config.q_samples} samples, and "
        "values above 1 are normal. A node with fewer samples so far (an agent that just "
        "started) is scaled to the same range. Standbys go to the node with the highest Q once "
        "the standby runs there."
    )


def q_ranks(nodes: list[dict]) -> dict[str, tuple[int, int]]:
    """node -> (its place by Q among alive nodes with a Q, 1 = highest; how many there are)."""
    alive = [n for n in by_q(nodes) if n["state"] == "up" and n["q_score"] is not None]
    return {n["name"]: (rank, len(alive)) for rank, n in enumerate(alive, start=1)}


def standby_explanations(standbys: list[dict], nodes: list[dict]) -> list[dict]:
    """Why each standby sits where it is: its node's Q and Q rank among alive nodes now, where
    its primary runs, and the policy's latest verdict on it (rule, reason, reserve check), all
    from `data.standby_rows()` and `data.node_rows()`."""
    ranks = q_ranks(nodes)
    q_of = {n["name"]: n["q_score"] for n in nodes}
    rows = []
    for standby in standbys:
        rank = ranks.get(standby["node"])
        rows.append(
            {
                **standby,
                "q": q_of.get(standby["node"]),
                "q_rank": f"#{rank[0]} of {rank[1]}" if rank else "not ranked (down or no Q)",
                "rule": standby["rule"] or "not judged yet",
                "reason": standby["reason"]
                or "No policy verdict yet: the supervisor started it (a replacement after a "
                "promotion); the next policy cycle judges it if the strategy lets the policy "
                "move standbys.",
                "reserve": standby["reserve"] or "—",
            }
        )
    return rows
