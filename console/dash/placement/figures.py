"""Placement charts: idle rates per node against the reserve, and the node queue by Q."""

from __future__ import annotations

import plotly.graph_objects as go

from console.dash.common import BASE_LAYOUT, FAULT, GRID, OK, series_colour

IDLE_BARS = (
    ("cpu_idle", "CPU idle"),
    ("mem_idle", "memory idle"),
    ("disk_idle", "disk idle"),
    ("bw_idle", "bandwidth idle"),
)


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
    placing standbys when the cluster's free share would fall below it."""
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


def q_figure(nodes: list[dict]) -> go.Figure:
    """Resource score Q per node, highest first (the order standbys are placed in)."""
    ordered = [n for n in by_q(nodes) if n["q_score"] is not None]
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
    fig.update_layout(
        **{**BASE_LAYOUT, "hovermode": "closest"},
        title={"text": "Resource score Q", "x": 0.01},
        yaxis={"autorange": "reversed"},
        xaxis={"title": "Q", "rangemode": "tozero", **GRID},
        uirevision="q",
        height=340,
    )
    return fig
