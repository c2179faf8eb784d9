"""Resource charts: CPU, memory, disk and network use of every node over time."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from console.dash.common import BASE_LAYOUT, GRID, series_colour

PANELS = (
    ("cpu_util", "CPU"),
    ("mem_util", "Memory"),
    ("disk_util", "Disk"),
    ("net_util", "Network"),
)


def resources_figure(frame: pd.DataFrame, nodes: dict[int, str]) -> go.Figure:
    """Four stacked panels (CPU, memory, disk, network, in % of capacity), one line per node.

    `frame` has at, node_id, name and value (fractions 0..1); `nodes` maps node id to name and
    fixes each node's colour across panels.
    """
    fig = make_subplots(
        rows=len(PANELS),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.05,
        subplot_titles=[f"{label} (% of capacity)" for _, label in PANELS],
    )
    for index, (node_id, name) in enumerate(nodes.items()):
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
                    line={"color": series_colour(index), "width": 1.8},
                ),
                row=row,
                col=1,
            )
            fig.update_yaxes(range=[0, 100], row=row, col=1)
    fig.update_xaxes(**GRID)
    fig.update_yaxes(**GRID)
    fig.update_layout(
        **{**BASE_LAYOUT, "legend": {"orientation": "h", "y": 1.06, "x": 0}},
        uirevision="resources",
        height=760,
    )
    return fig
