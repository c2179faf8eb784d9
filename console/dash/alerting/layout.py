"""Alerting page layout: open alerts, the routes, deliveries by route and status, the newest
deliveries."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import card, refresh_timer

GRAPH_CONFIG = {"displaylogo": False}
STATUS_CHOICES = [
    {"label": "every status", "value": ""},
    {"label": "pending", "value": "pending"},
    {"label": "delivered", "value": "delivered"},
    {"label": "failed", "value": "failed"},
]


def layout():
    """The page skeleton; the callback fills it on the first refresh and every 2 s after."""
    return html.Div(
        [
            refresh_timer(),
            card("Open alerts", html.Div(id="alerts-table")),
            card("Routes", html.Div(id="routes-table")),
            html.Div(dcc.Graph(id="deliveries-chart", config=GRAPH_CONFIG), className="card"),
            html.Div(
                [
                    html.Span("Deliveries", className="muted"),
                    dcc.Dropdown(
                        id="delivery-status",
                        options=STATUS_CHOICES,
                        value="",
                        clearable=False,
                        className="job-picker",
                    ),
                ],
                className="toolbar",
            ),
            card("Newest deliveries", html.Div(id="deliveries-table")),
        ]
    )
