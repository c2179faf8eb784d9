"""Overview layout: KPI tiles, jobs, episodes, nodes and two live charts. Layout only."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import card, refresh_timer, result_slot, window_picker
from console.models import Job


def layout():
    """The page skeleton; callbacks fill every part on the first refresh and every 2 s after."""
    return html.Div(
        [
            dcc.Location(id="url"),
            refresh_timer(),
            html.Div(id="kpis", className="kpis"),
            card("Jobs", html.Div(id="jobs-table")),
            html.Div(id="controls"),
            html.Div(
                [
                    html.Span("Window", className="muted"),
                    window_picker("window"),
                ],
                className="toolbar",
            ),
            html.Div(
                [
                    html.Div(
                        dcc.Graph(id="utilisation", config={"displaylogo": False}), className="card"
                    ),
                    html.Div(
                        dcc.Graph(id="throughput", config={"displaylogo": False}), className="card"
                    ),
                ],
                className="grid-2",
            ),
            card("Open and recent recovery episodes", html.Div(id="episodes-table")),
            card("Node health", html.Div(id="nodes-table")),
        ]
    )


def controls(topologies: list[str]):
    """Start and stop jobs; only rendered for operators (the callbacks check the role again).
    `topologies`: what a job may run (built-in topologies and registered user jobs)."""
    return card(
        "Controls",
        html.Div(
            [
                html.Div(
                    [
                        html.H3("Start a job"),
                        dcc.Input(
                            id="start-name", placeholder="job name", value="", className="ctl"
                        ),
                        dcc.Dropdown(
                            id="start-topology",
                            options=topologies,
                            value="wordcount",
                            clearable=False,
                            className="ctl",
                        ),
                        dcc.Dropdown(
                            id="start-strategy",
                            options=[
                                {"label": label, "value": value}
                                for value, label in Job.Strategy.choices
                            ],
                            value=Job.Strategy.ADAPTIVE,
                            clearable=False,
                            className="ctl-wide",
                        ),
                        dcc.Input(
                            id="start-rate",
                            type="number",
                            min=0,
                            max=100_000,
                            value=500,
                            className="ctl-narrow",
                        ),
                        html.Span("events/s", className="muted"),
                        html.Button("Start job", id="start-button", className="btn"),
                        result_slot("start-result"),
                    ],
                    className="control-group",
                ),
                html.Div(
                    [
                        html.H3("Stop a job"),
                        dcc.Dropdown(
                            id="stop-job", placeholder="choose a job", className="ctl-wide"
                        ),
                        html.Button("Stop job", id="stop-button", className="btn btn-danger"),
                        dcc.ConfirmDialog(id="stop-confirm"),
                        result_slot("stop-result"),
                    ],
                    className="control-group",
                ),
            ],
            className="grid-2",
        ),
        extra_class="controls",
    )
