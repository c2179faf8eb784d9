"""Job page charts and panels: the operator DAG, the history of each operator's scores with the
job's upgrades marked on it, and the Kafka panel of a job reading or writing Kafka."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import plotly.graph_objects as go
from dash import html
from plotly.subplots import make_subplots

from console.dash.common import (
    BASE_LAYOUT,
    FAULT,
    GRID,
    MODE_COLOURS,
    OK,
    PASSIVE,
    fmt_num,
    series_colour,
    table,
)
from console.models import JobUpgrade
from spark_runtime.external_io import EVENT_TIME_FROM_RECORD

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


# --- Kafka ------------------------------------------------------------------------------------


def kafka_source_facts(source: dict) -> list[tuple[str, str, str]]:
    """(label, value, id) of the source topic and how it is read: where a new job starts
    (starting_offsets), the event time, and what offsets lost to retention do (accept_loss)."""
    if not source:
        return [("source topic", "— (the job's own input stream)", "kafka-source-topic")]
    event_time = source.get("event_time", EVENT_TIME_FROM_RECORD)
    return [
        ("source topic", source.get("topic", "?"), "kafka-source-topic"),
        ("starting offsets", source.get("starting_offsets", "earliest"), "kafka-starting"),
        (
            "event time",
            "the record's timestamp" if event_time == EVENT_TIME_FROM_RECORD else event_time,
            "kafka-event-time",
        ),
        (
            "offsets lost to retention",
            "skipped and counted (accept_loss)"
            if source.get("accept_loss")
            else "fail the batch (no accept_loss)",
            "kafka-accept-loss",
        ),
    ]


def kafka_lag_rows(lags: list, now: float) -> list[list]:
    """One row per partition of each stage's primary: stage, primary, partition, read offset,
    end offset, lag (end - read) and how long ago the primary published them; then the total."""
    rows = []
    for lag in lags:
        age = f"{max(0.0, now - lag.at):.0f} s ago"
        for p in lag.partitions:
            rows.append(
                [lag.stage, lag.replica, str(p.partition), fmt_num(p.read, 0), fmt_num(p.end, 0),
                 html.Span(fmt_num(p.lag, 0), className="num"), age]
            )  # fmt: skip
    if rows:
        total = sum(lag.total for lag in lags)
        rows.append([html.B("total"), "", "", "", "", html.B(fmt_num(total, 0)), ""])
    return rows


def _kafka_field(label: str, value, field_id: str):
    return html.Div(
        [html.Span(label, className="muted"), html.Span(value, id=field_id)], className="kv"
    )


def kafka_panel(view: dict | None, output_eps: float | None = None):
    """The Kafka panel of a job (console.dash.kafka_data.job_kafka; None: the job uses no
    Kafka, nothing to show): the source's cause as a warning while it cannot read, the topics,
    records in and out per second, the total lag, dead letters and skipped offsets, then the
    lag of each partition as the stages' primaries published it. `output_eps`: the job's
    newest throughput (records out of its last stage)."""
    if view is None:
        return None
    source, sink, lags = view["source"], view["sink"], view["lags"]
    warning = None
    if view["cause"]:
        warning = html.Div(
            [
                html.B("The Kafka source is not reading: "),
                html.Span(view["cause"], id="kafka-cause"),
            ],
            className="kafka-warning",
            id="kafka-warning",
        )
    dead = view["dead"]
    dead_text = fmt_num(sum(dead.values()), 0)
    if any(dead.values()):
        dead_text += " (" + ", ".join(f"{stage} {n:,}" for stage, n in dead.items() if n) + ")"
    sink_text = sink.get("topic", "?") if sink else "— (results in Redis only)"
    facts = html.Div(
        [
            *(_kafka_field(*fact) for fact in kafka_source_facts(source)),
            _kafka_field("sink topic", sink_text, "kafka-sink-topic"),
            _kafka_field("records in (/s)", fmt_num(view["input_eps"], 0), "kafka-in"),
            _kafka_field("records out (/s)", fmt_num(output_eps, 0), "kafka-out"),
            _kafka_field("lag (records)", fmt_num(view["total"], 0) if source else "—",
                         "kafka-total"),
            _kafka_field("dead letters", dead_text, "kafka-dead"),
            _kafka_field("skipped offsets (lost to retention)", fmt_num(view["skipped"], 0),
                         "kafka-skipped"),
        ],
        className="kv-grid",
    )  # fmt: skip
    lag_table = None
    if source:
        lag_table = table(
            ["Stage", "Primary", "Partition", "Read offset", "End offset", "Lag", "Published"],
            kafka_lag_rows(lags, view["now"]),
            f"No lag published yet by a primary reading {source.get('topic', '?')}.",
            table_id="kafka-lag",
        )
    return html.Div([warning, facts, lag_table])
