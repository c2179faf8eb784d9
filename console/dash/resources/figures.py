"""Resource charts: CPU, memory, disk and network use of every node over time."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from console.dash.common import BASE_LAYOUT, GRID, PASSIVE, series_colour

PANELS = (
    ("cpu_util", "CPU"),
    ("mem_util", "Memory"),
    ("disk_util", "Disk"),
    ("net_util", "Network"),
)
BAND_FILL = "rgba(138, 148, 166, 0.25)"


def resources_figure(
    frame: pd.DataFrame,
    nodes: dict[int, str],
    lines: list[int] | None = None,
    band: pd.DataFrame | None = None,
) -> go.Figure:
    """Four stacked panels (CPU, memory, disk, network, in % of capacity), one line per node.

    `frame` has at, node_id, name and value (fractions 0..1); `nodes` maps node id to name and
    fixes each node's colour across panels. With `lines` (node ids; at fleet size) only those
    nodes get a line, over a grey band from the lowest to the highest node with the fleet's
    mean dashed (`band`: name, at, low, mean, high, from data.node_band): 50 lines per panel
    cannot be told apart.
    """
    fig = make_subplots(
        rows=len(PANELS),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        subplot_titles=[f"{label} (% of capacity)" for _, label in PANELS],
    )
    if band is not None:
        for row, (metric, _) in enumerate(PANELS, start=1):
            points = band[band["name"] == metric]
            common = {"x": points["at"], "legendgroup": "fleet", "hoverinfo": "skip"}
            fig.add_trace(
                go.Scatter(
                    **common, y=points["low"] * 100, mode="lines", line={"width": 0},
                    showlegend=False, name="lowest node",
                ),
                row=row, col=1,
            )  # fmt: skip
            fig.add_trace(
                go.Scatter(
                    **common, y=points["high"] * 100, mode="lines", line={"width": 0},
                    fill="tonexty", fillcolor=BAND_FILL, name=f"all {len(nodes)} nodes: range",
                    showlegend=row == 1,
                ),
                row=row, col=1,
            )  # fmt: skip
            fig.add_trace(
                go.Scatter(
                    x=points["at"], y=points["mean"] * 100, mode="lines", legendgroup="fleet",
                    line={"color": PASSIVE, "width": 1.5, "dash": "dash"},
                    name=f"all {len(nodes)} nodes: mean", showlegend=row == 1,
                ),
                row=row, col=1,
            )  # fmt: skip
    shown = nodes if lines is None else {pk: nodes[pk] for pk in lines if pk in nodes}
    colours = {pk: series_colour(index) for index, pk in enumerate(nodes)}
    if lines is not None:
        colours = {pk: series_colour(index) for index, pk in enumerate(shown)}
    for node_id, name in shown.items():
        for row, (metric, _) in enumerate(PANELS, start=1):
            points = frame[(frame["node_id"] == node_id) & (frame["name"] == metric)]
            fig.add_trace(
                go.Scatter(
                    x=points["at"],
                    y=points["value"] * 100,
                    name=name,
                    legendgroup=name,
                    showlegend=row == 1,
                    mode="lines",
                    line={"color": colours[node_id], "width": 1.8},
                ),
                row=row,
                col=1,
            )
    for row in range(1, len(PANELS) + 1):
        fig.update_yaxes(range=[0, 100], row=row, col=1)
    fig.update_xaxes(**GRID)
    fig.update_yaxes(**GRID)
    layout = {**BASE_LAYOUT, "legend": {"orientation": "h", "y": 1.06, "x": 0}}
    if band is not None:  # two rows of legend: keep them clear of the first panel's title
        layout["legend"] = {"orientation": "h", "y": 1.1, "x": 0}
        layout["margin"] = {**BASE_LAYOUT["margin"], "t": 70}
    fig.update_layout(**layout, uirevision="resources", height=780)
    return fig
