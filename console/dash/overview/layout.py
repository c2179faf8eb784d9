"""Overview layout: fleet totals, the job list (filtered, sorted, paged), episodes, nodes and two
live charts. Layout only."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import card, refresh_timer, result_slot, window_picker
from console.models import Job

# Jobs per page of the overview's list.
PAGE_SIZE = 25
# Sort choices of the job list (keys of console.services.queries.JOB_SORTS).
SORT_OPTIONS = [
    {"label": "newest first", "value": "newest"},
    {"label": "oldest first", "value": "oldest"},
    {"label": "name", "value": "name"},
    {"label": "status", "value": "status"},
    {"label": "strategy", "value": "strategy"},
    {"label": "topology", "value": "topology"},
    {"label": "throughput (highest)", "value": "throughput"},
    {"label": "p99 (highest)", "value": "p99"},
    {"label": "open episodes (most)", "value": "open_episodes"},
]
OPEN_ONLY = "open"


def job_filters():
    """Filters, sort and pager of the job list. The topology and node options arrive with the
    first callback (they come from the database)."""
    return html.Div(
        [
            dcc.Input(
                id="job-search",
                placeholder="name contains",
                debounce=True,
                className="ctl-filter",
            ),
            dcc.Dropdown(
                id="job-status",
                options=[{"label": label, "value": value} for value, label in Job.Status.choices],
                multi=True,
                placeholder="any status",
                className="ctl-filter",
            ),
            dcc.Dropdown(
                id="job-strategy",
                options=[{"label": value, "value": value} for value, _ in Job.Strategy.choices],
                multi=True,
                placeholder="any strategy",
                className="ctl-filter",
            ),
            dcc.Dropdown(
                id="job-topology", multi=True, placeholder="any topology", className="ctl-filter"
            ),
            dcc.Dropdown(id="job-node", placeholder="on any node", className="ctl-filter"),
            dcc.Checklist(
                id="job-open",
                options=[{"label": " with an open recovery", "value": OPEN_ONLY}],
                value=[],
                inline=True,
            ),
            dcc.Dropdown(
                id="job-sort",
                options=SORT_OPTIONS,
                value="newest",
                clearable=False,
                className="ctl-filter",
            ),
            html.Div(
                [
                    html.Button("‹ Prev", id="jobs-prev", className="btn btn-small"),
                    html.Button("Next ›", id="jobs-next", className="btn btn-small"),
                ],
                className="pager",
            ),
            dcc.Store(id="jobs-page", data=1),
        ],
        className="toolbar filters",
    )


def layout():
    """The page skeleton; callbacks fill every part on the first refresh and every 2 s after."""
    return html.Div(
        [
            dcc.Location(id="url"),
            refresh_timer(),
            html.Div(id="kpis", className="kpis"),
            card("Jobs", job_filters(), html.Div(id="jobs-table")),
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
            card("Node health (nodes not up first)", html.Div(id="nodes-table")),
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
                        dcc.Input(
                            id="start-source-topic",
                            placeholder="Kafka input topic (empty: its own stream)",
                            value="",
                            className="ctl-wide",
                        ),
                        dcc.Input(
                            id="start-sink-topic",
                            placeholder="Kafka results topic (optional)",
                            value="",
                            className="ctl-wide",
                        ),
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
