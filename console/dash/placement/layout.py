"""Placement layout: charts, one card per node with its replicas, why each standby sits where it
is, the policy. Layout only."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import card, refresh_timer, result_slot
from console.models import Policy

GRAPH_CONFIG = {"displaylogo": False}


def layout():
    """The page skeleton; callbacks fill it on the first refresh and every 2 s after."""
    return html.Div(
        [
            dcc.Location(id="url"),
            refresh_timer(),
            html.Div(id="reserve-summary", className="kpis"),
            html.Div(
                [
                    html.Div(dcc.Graph(id="idle", config=GRAPH_CONFIG), className="card"),
                    html.Div(
                        [
                            dcc.Graph(id="q", config=GRAPH_CONFIG),
                            html.P(id="q-scale", className="muted small"),
                        ],
                        className="card",
                    ),
                ],
                className="grid-2",
            ),
            html.Div(id="node-cards", className="node-cards"),
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
