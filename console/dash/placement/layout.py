"""Placement layout: charts, one card per node with its replicas, why each standby sits where it
is, the policy. Layout only."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import card, refresh_timer, result_slot
from console.models import Policy

GRAPH_CONFIG = {"displaylogo": False}
# Which node cards to show (at fleet size, the ones that need a look).
NODE_SHOW_OPTIONS = [
    {"label": "every node", "value": "all"},
    {"label": "nodes up", "value": "up"},
    {"label": "nodes not up", "value": "not-up"},
    {"label": "CPU or memory idle below the reserve", "value": "busy"},
    {"label": "nodes with standbys", "value": "standbys"},
]


def layout():
    """The page skeleton; callbacks fill it on the first refresh and every 2 s after."""
    return html.Div(
        [
            dcc.Location(id="url"),
            refresh_timer(),
            html.Div(id="reserve-summary", className="kpis"),
            html.Div(dcc.Graph(id="idle", config=GRAPH_CONFIG), className="card"),
            html.Div(
                [
                    dcc.Graph(id="q", config=GRAPH_CONFIG),
                    html.P(id="q-scale", className="muted small"),
                ],
                className="card",
            ),
            html.Div(
                [
                    html.Span("Show", className="muted"),
                    dcc.Dropdown(
                        id="node-show",
                        options=NODE_SHOW_OPTIONS,
                        value="all",
                        clearable=False,
                        className="ctl-wide",
                    ),
                    dcc.Input(
                        id="node-job",
                        placeholder="only replicas of jobs named ...",
                        debounce=True,
                        className="ctl-filter",
                    ),
                    html.Span(id="node-count", className="muted small"),
                ],
                className="toolbar filters",
            ),
            html.Div(id="node-cards", className="node-cards scroll-box"),
            card("Host reserve (measured)", html.Div(id="host-reserve")),
            card("Why each standby sits where it is", html.Div(id="standby-table")),
            card("Fault prediction", html.Div(id="predictor-table")),
            card("Policy in force", html.Div(id="policy-table")),
            html.Div(id="controls"),
        ]
    )


def controls():
    """Threshold editing with a confirm step; only rendered for admins."""
    return card(
        "Edit a threshold",
        html.Div(
            [
                dcc.Dropdown(
                    id="threshold-field",
                    options=Policy.threshold_field_names(),
                    value="resource_reserve",
                    clearable=False,
                    className="ctl",
                ),
                dcc.Input(id="threshold-value", type="number", placeholder="new value"),
                dcc.Input(
                    id="threshold-reason",
                    placeholder="reason (kept in the history)",
                    className="ctl-wide",
                ),
                html.Button("Save threshold", id="threshold-button", className="btn"),
                dcc.ConfirmDialog(id="threshold-confirm"),
                result_slot("threshold-result"),
            ],
            className="control-group",
        ),
        extra_class="controls",
    )
