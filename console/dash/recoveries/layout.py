"""Recovery timelines layout: job picker, side-by-side timelines, episodes, strategies."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import card, refresh_timer, window_picker

GRAPH_CONFIG = {"displaylogo": False}


def layout():
    """The page skeleton; callbacks fill it on the first refresh and every 2 s after."""
    return html.Div(
        [
            refresh_timer(),
            html.Div(
                [
                    html.Span("Jobs", className="muted"),
                    dcc.Dropdown(
                        id="jobs",
                        multi=True,
                        placeholder="newest jobs (pick up to 4 to compare)",
                        className="job-picker",
                    ),
                    html.Span("Window", className="muted"),
                    window_picker("window"),
                ],
                className="toolbar",
            ),
            html.Div(
                [
                    dcc.Graph(id="timelines", config=GRAPH_CONFIG),
                    html.P(
                        [
                            html.Span("■ downtime", className="legend-fault"),
                            html.Span("■ recovery (catch-up)", className="legend-recovery"),
                            html.Span("┆ fault injected", className="legend-fault"),
                        ],
                        className="legend-note",
                    ),
                ],
                className="card",
            ),
            html.Div(dcc.Graph(id="phases", config=GRAPH_CONFIG), className="card"),
            card("Recovery episodes", html.Div(id="episodes-table")),
            html.Div(
                [
                    html.Div(dcc.Graph(id="strategies", config=GRAPH_CONFIG), className="card"),
                    card("Per strategy", html.Div(id="strategies-table")),
                ],
                className="grid-2",
            ),
        ]
    )
