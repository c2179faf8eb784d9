"""Job page layout: summary, DAG, operator table and history, decisions, failures. Layout only."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import card, refresh_timer, result_slot, window_picker
from console.models import FaultInjection

GRAPH_CONFIG = {"displaylogo": False}


def layout():
    """The page skeleton; the job id comes from the URL (/console/jobs/<id>/)."""
    return html.Div(
        [
            dcc.Location(id="url"),
            refresh_timer(),
            html.Div(id="summary", className="kpis"),
            html.Div(id="job-failure"),
            html.Div(id="controls"),
            html.Div(
                [
                    html.Div(dcc.Graph(id="dag", config=GRAPH_CONFIG), className="card"),
                    card("Replicas", html.Div(id="replicas-table")),
                ],
                className="grid-2",
            ),
            card("Operators", html.Div(id="operators-table")),
            html.Div(
                [html.Span("History window", className="muted"), window_picker("window")],
                className="toolbar",
            ),
            html.Div(dcc.Graph(id="history", config=GRAPH_CONFIG), className="card"),
            card("Controller decisions", html.Div(id="decisions-table")),
            card("Failure history", html.Div(id="failures-table")),
            card("Fault requests", html.Div(id="faults-table")),
        ]
    )


def controls(operator_options: list[str], node_options: list[dict]):
    """Fault injection (with a confirm step) and stop; only rendered for operators."""
    return card(
        "Controls",
        html.Div(
            [
                html.Div(
                    [
                        html.H3("Inject a fault"),
                        dcc.Dropdown(
                            id="fault-kind",
                            options=[
                                {"label": f"{value} — {label}", "value": value}
                                for value, label in FaultInjection.Kind.choices
                            ],
                            value=FaultInjection.Kind.KILL_DRIVER,
                            clearable=False,
                            className="ctl-wide",
                        ),
                        dcc.Dropdown(
                            id="fault-operator",
                            options=operator_options,
                            placeholder="operator",
                            className="ctl",
                        ),
                        dcc.Dropdown(
                            id="fault-node",
                            options=node_options,
                            placeholder="node",
                            className="ctl",
                        ),
                        dcc.Input(
                            id="fault-duration",
                            type="number",
                            min=1,
                            max=600,
                            placeholder="seconds (pause, stress)",
                            className="ctl",
                        ),
                        dcc.Input(
                            id="fault-workers",
                            type="number",
                            min=1,
                            step=1,
                            placeholder="CPU hogs (stress)",
                            className="ctl",
                        ),
                        html.Button("Inject fault", id="fault-button", className="btn btn-danger"),
                        dcc.ConfirmDialog(id="fault-confirm"),
                        result_slot("fault-result"),
                    ],
                    className="control-group",
                ),
                html.Div(
                    [
                        html.H3("Stop or restart this job"),
                        html.Button("Stop job", id="stop-button", className="btn btn-danger"),
                        dcc.ConfirmDialog(id="stop-confirm"),
                        result_slot("stop-result"),
                        html.Button("Restart job", id="restart-button", className="btn"),
                        dcc.ConfirmDialog(id="restart-confirm"),
                        result_slot("restart-result"),
                    ],
                    className="control-group",
                ),
            ],
            className="grid-2",
        ),
        extra_class="controls",
    )
