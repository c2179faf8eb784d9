"""Resources layout: window picker, node picker and one chart with a panel per resource. Layout
only."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import refresh_timer, window_picker


def layout():
    """The page skeleton; the callback fills the chart every 2 s."""
    return html.Div(
        [
            dcc.Location(id="url"),
            refresh_timer(),
            html.Div(
                [
                    html.Span("Window", className="muted"),
                    window_picker("window"),
                    dcc.Dropdown(
                        id="resources-nodes",
                        multi=True,
                        placeholder="nodes to draw (default: all, or the 5 busiest)",
                        className="node-picker",
                    ),
                ],
                className="toolbar",
            ),
            html.Div(
                [
                    dcc.Graph(id="resources", config={"displaylogo": False}),
                    html.P(id="resources-note", className="muted small"),
                ],
                className="card",
            ),
        ]
    )
