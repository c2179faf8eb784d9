"""Job page charts: the operator DAG and the history of each operator's scores, with the job's
upgrades marked on it."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from console.dash.common import (
    BASE_LAYOUT,
    FAULT,
    GRID,
    MODE_COLOURS,
    OK,
    PASSIVE,
    series_colour,
)
from console.models import JobUpgrade

HISTORY_ROWS = (
    ("priority", "Priority P"),
    ("checkpoint_interval_s", "Checkpoint interval (s)"),
    ("predicted_fault_rate", "Predicted fault rate"),
)
# Marker colours: the new version took the output over; the old version took it back.
SWITCH, ROLLBACK = "switch", "rollback"
MARKER_COLOURS = {SWITCH: OK, ROLLBACK: FAULT}


def dag_positions(operators: list[dict]) -> dict[str, tuple[float, float]]:
    """x = longest path from a source (the layer), y = spread evenly within the layer."""
    upstream = {op["name"]: [u for u in op["upstream"]] for op in operators}
    layer: dict[str, int] = {}

    def depth(name: str) -> int:
        if name not in layer:
            # Operators whose upstream is unknown (should not happen) count as sources.
            parents = [u for u in upstream.get(name, []) if u in upstream]
            layer[name] = 1 + max((depth(p) for p in parents), default=-1)
        return layer[name]

    for op in operators:
        depth(op["name"])
    positions = {}
    for x in sorted(set(layer.values())):
        names = [op["name"] for op in operators if layer[op["name"]] == x]
        for index, name in enumerate(names):
            positions[name] = (float(x), (len(names) - 1) / 2 - index)
    return positions


def dag_figure(operators: list[dict], threshold: float | None = None) -> go.Figure:
    """The operator DAG: each operator a circle coloured by mode and labelled with its priority.

    `operators` items need name, upstream, mode, priority and kind.
    """
    positions = dag_positions(operators)
    fig = go.Figure()
    for op in operators:
        x1, y1 = positions[op["name"]]
        for parent in op["upstream"]:
            if parent not in positions:
                continue
            x0, y0 = positions[parent]
            fig.add_annotation(
                x=x1 - 0.12,
                y=y1,
                ax=x0 + 0.12,
                ay=y0,
                xref="x",
                yref="y",
                axref="x",
                ayref="y",
                showarrow=True,
                arrowhead=3,
                arrowsize=1.2,
                arrowwidth=1.5,
                arrowcolor="#8a94a6",
                text="",
            )
    for mode, colour in MODE_COLOURS.items():
        chosen = [op for op in operators if op["mode"] == mode]
        fig.add_trace(
            go.Scatter(
                x=[positions[op["name"]][0] for op in chosen],
                y=[positions[op["name"]][1] for op in chosen],
                mode="markers+text",
                name=f"{mode} ({'hot standby' if mode == 'active' else 'checkpoint'})",
                marker={"size": 44, "color": colour, "line": {"color": "#ffffff", "width": 2}},
                text=[f"<b>{op['name']}</b><br>P={op['priority']:.2f}" for op in chosen],
                textposition="bottom center",
                customdata=[[op["kind"], op["mode"]] for op in chosen],
                hovertemplate="%{text}<br>%{customdata[0]}, %{customdata[1]}<extra></extra>",
                showlegend=True,
            )
        )
    xs = [p[0] for p in positions.values()] or [0]
    ys = [p[1] for p in positions.values()] or [0]
    title = "Operators (colour: mode, label: priority)"
    if threshold is not None:
        title += f" — active above P={threshold:.2f}"
    fig.update_layout(
        **{**BASE_LAYOUT, "hovermode": "closest"},
        title={"text": title, "x": 0.01},
        xaxis={"visible": False, "range": [min(xs) - 0.5, max(xs) + 0.5]},
        yaxis={"visible": False, "range": [min(ys) - 0.9, max(ys) + 0.5]},
        uirevision="dag",
        height=300,
    )
    return fig


def upgrade_markers(upgrades: list[dict], since: datetime) -> list[dict]:
    """Where the job's upgrades changed its output since `since`, oldest first: each switch to
    the new version ("upgrade N") and each rollback to the old one ("upgrade N rolled back"),
    as {"at", "label", "kind"} from upgrade rows (console.dash.data.upgrade_rows)."""
    markers = []
    for upgrade in upgrades:
        if upgrade["switched_at"] is not None:
            markers.append(
                {"at": upgrade["switched_at"], "label": f"upgrade {upgrade['id']}", "kind": SWITCH}
            )
        if upgrade["status"] == JobUpgrade.Status.ROLLED_BACK and upgrade["ended_at"] is not None:
            markers.append(
                {
                    "at": upgrade["ended_at"],
                    "label": f"upgrade {upgrade['id']} rolled back",
                    "kind": ROLLBACK,
                }
            )
    # Only what falls in the window: a marker before it would stretch the time axis.
    return sorted((m for m in markers if m["at"] >= since), key=lambda m: m["at"])


def history_figure(
    frame: pd.DataFrame,
    operator_names: list[str],
    threshold: float | None,
    markers: list[dict] | tuple = (),
):
    """Priority, checkpoint interval and predicted fault rate of each operator over time.

    `frame` has at, stage (operator name), name (metric) and value; the priority panel shows the
    active/passive threshold as a dashed line. `markers` (upgrade_markers) are vertical lines
    across the panels, labelled at the top.
    """
    fig = make_subplots(
        rows=len(HISTORY_ROWS),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=[title for _, title in HISTORY_ROWS],
    )
    for index, operator in enumerate(operator_names):
        for row, (metric, _) in enumerate(HISTORY_ROWS, start=1):
            rows = frame[(frame["stage"] == operator) & (frame["name"] == metric)]
            fig.add_trace(
                go.Scatter(
                    x=rows["at"],
                    y=rows["value"],
                    name=operator,
                    legendgroup=operator,
                    showlegend=row == 1,
                    mode="lines",
                    line={"color": series_colour(index), "width": 2, "shape": "hv"},
                ),
                row=row,
                col=1,
            )
    if threshold is not None:
        fig.add_hline(
            y=threshold,
            row=1,
            col=1,
            line={"dash": "dash", "color": PASSIVE, "width": 1},
            annotation_text="active threshold",
            annotation_position="top left",
        )
    for marker in markers:
        colour = MARKER_COLOURS[marker["kind"]]
        # One line through every panel (they share the time axis), labelled once above them.
        fig.add_shape(
            type="line",
            x0=marker["at"],
            x1=marker["at"],
            xref="x",
            y0=0,
            y1=1,
            yref="paper",
            line={"color": colour, "width": 1.5, "dash": "dot"},
            name=marker["label"],
        )
        fig.add_annotation(
            x=marker["at"],
            y=1,
            xref="x",
            yref="paper",
            yanchor="bottom",
            text=marker["label"],
            showarrow=False,
            font={"color": colour, "size": 11},
        )
    fig.update_layout(
        **{**BASE_LAYOUT, "legend": {"orientation": "h", "y": -0.08}},
        uirevision="history",
        height=520,
    )
    fig.update_xaxes(**GRID)
    fig.update_yaxes(**GRID)
    return fig


def stage_chains(operators: list[dict]) -> dict[str, str]:
    """Stage -> the operators it chains, in topology order ("split → count"), from operator rows
    (each carries the stage it runs in; sources and sinks run in none)."""
    chains: dict[str, list[str]] = {}
    for op in operators:
        if op.get("stage"):
            chains.setdefault(op["stage"], []).append(op["name"])
    return {stage: " → ".join(names) for stage, names in chains.items()}
