"""Overview charts: pure functions from plain data to plotly figures."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from console.dash.common import BASE_LAYOUT, GRID, series_colour

CPU_COLOUR = "#2457d6"
MEM_COLOUR = "#9334e6"


def utilisation_figure(frame: pd.DataFrame, reserve: float) -> go.Figure:
    """Cluster CPU and memory utilisation (0..1 in `frame` columns at, cpu, mem) in percent.

    A dashed line marks 1 - reserve: above it the policy stops adding standbys.
    """
    fig = go.Figure()
    for column, label, colour in (("cpu", "CPU", CPU_COLOUR), ("mem", "Memory", MEM_COLOUR)):
        fig.add_trace(
            go.Scatter(
                x=frame["at"],
                y=frame[column] * 100,
                name=label,
                mode="lines",
                line={"color": colour, "width": 2},
            )
        )
    limit = (1 - reserve) * 100
    fig.add_hline(
        y=limit,
        line={"dash": "dash", "color": "#5c6677", "width": 1},
        annotation_text=f"reserve limit {limit:.0f}%",
        annotation_position="top left",
    )
    fig.update_layout(
        **BASE_LAYOUT,
        title={"text": "Cluster utilisation", "x": 0.01},
        yaxis={"title": "%", "range": [0, 100], **GRID},
        xaxis=GRID,
        uirevision="utilisation",
        height=300,
    )
    return fig


# Above this many lines the legend would crowd out the chart; hovering names each line.
MAX_LEGEND_ENTRIES = 8


def throughput_figure(frame: pd.DataFrame, job_names: dict[int, str]) -> go.Figure:
    """Throughput (events/s) of each job over time; `frame` has at, job_id, value."""
    fig = go.Figure()
    for index, (job_id, name) in enumerate(job_names.items()):
        rows = frame[frame["job_id"] == job_id]
        fig.add_trace(
            go.Scatter(
                x=rows["at"],
                y=rows["value"],
                name=name,
                mode="lines",
                line={"color": series_colour(index), "width": 2},
            )
        )
    fig.update_layout(
        **BASE_LAYOUT,
        title={"text": "Throughput of the first live jobs listed", "x": 0.01},
        yaxis={"title": "events/s", "rangemode": "tozero", **GRID},
        xaxis=GRID,
        showlegend=len(job_names) <= MAX_LEGEND_ENTRIES,
        uirevision="throughput",
        height=300,
    )
    return fig
