"""Job page layout: summary, upgrade in progress, Kafka (a job reading or writing Kafka), DAG,
operator table and history, upgrades, decisions, failures, and the operators' controls. Layout
only."""

from __future__ import annotations

from dash import dcc, html

from console.dash.common import card, refresh_timer, result_slot, window_picker
from console.models import FaultInjection

GRAPH_CONFIG = {"displaylogo": False}
PRESERVING_LABEL = (
    " Results do not change: check them against the running version's, roll back if they differ"
)


def layout():
    """The page skeleton; the job id comes from the URL (/console/jobs/<id>/)."""
    return html.Div(
        [
            dcc.Location(id="url"),
            refresh_timer(),
            html.Div(id="summary", className="kpis"),
            html.Div(id="job-failure"),
            html.Div(id="controls"),
            # What the refresh knows of the upgrade under way, for the Confirm and Roll back
            # buttons (rendered for operators only, so not part of the shared refresh).
            dcc.Store(id="upgrade-under-way"),
            html.Section(
                [
                    html.H2("Upgrade in progress"),
                    html.Div(id="upgrade-panel"),
                    html.Div(id="upgrade-actions"),
                ],
                id="upgrade-card",
                className="card upgrade-card",
                hidden=True,
            ),
            # Shown for a job with a Kafka source or sink only.
            html.Section(
                [html.H2("Kafka"), html.Div(id="kafka-panel")],
                id="kafka-card",
                className="card kafka-card",
                hidden=True,
            ),
            # Shown for an app (spark_runtime/apps.py) only: its queries and its output.
            html.Section(
                [
                    html.H2("App queries"),
                    html.Div(id="app-queries"),
                    dcc.Graph(id="app-rates", config=GRAPH_CONFIG),
                    html.H3("Output (newest last)"),
                    html.Div(id="app-output"),
                ],
                id="app-card",
                className="card app-card",
                hidden=True,
            ),
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
            card("Upgrades", html.Div(id="upgrades-table")),
            card("Controller decisions", html.Div(id="decisions-table")),
            card("Failure history", html.Div(id="failures-table")),
            card("Fault requests", html.Div(id="faults-table")),
        ]
    )


def controls(
    operator_options: list[str],
    node_options: list[dict],
    versions: list[str],
    current_version: str,
    params_in_force: str,
    strategies: list[str],
    current_strategy: str,
):
    """Fault injection, stop and restart, upgrade and strategy change (each with a confirm
    step); only rendered for operators. The upgrade offers the registered `versions` of the
    job's topology, the `current_version` chosen, and its operator parameters (`OP.KEY=value`
    lines) prefilled; the strategy change offers `strategies`, `current_strategy` chosen."""
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
                            placeholder="seconds (timed faults)",
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
                html.Div(
                    [
                        html.H3("Upgrade this job (blue/green)"),
                        dcc.Dropdown(
                            id="upgrade-version",
                            options=[
                                {
                                    "label": f"{v} (running)" if v == current_version else v,
                                    "value": v,
                                }
                                for v in versions
                            ],
                            value=current_version,
                            clearable=False,
                            className="ctl",
                        ),
                        dcc.Textarea(
                            id="upgrade-params",
                            value=params_in_force,
                            placeholder="operator parameters, one OP.KEY=value a line "
                            "(empty: the version's own)",
                            className="ctl-wide upgrade-params",
                        ),
                        dcc.Checklist(
                            id="upgrade-result-preserving",
                            options=[{"label": PRESERVING_LABEL, "value": "yes"}],
                            value=[],
                            className="ctl-wide",
                        ),
                        html.Button("Upgrade", id="upgrade-button", className="btn"),
                        dcc.ConfirmDialog(id="upgrade-confirm"),
                        result_slot("upgrade-result"),
                    ],
                    className="control-group",
                ),
                html.Div(
                    [
                        html.H3("Change the strategy (in place)"),
                        dcc.Dropdown(
                            id="strategy-choice",
                            options=[
                                {
                                    "label": f"{s} (running)" if s == current_strategy else s,
                                    "value": s,
                                }
                                for s in strategies
                            ],
                            value=current_strategy,
                            clearable=False,
                            className="ctl",
                        ),
                        html.Button("Change strategy", id="strategy-button", className="btn"),
                        dcc.ConfirmDialog(id="strategy-confirm"),
                        result_slot("strategy-result"),
                    ],
                    className="control-group",
                ),
            ],
            className="grid-2",
        ),
        extra_class="controls",
    )


def upgrade_actions():
    """Confirm (enabled once the new version writes) and Roll back, each with a confirm step;
    only rendered for operators, under the upgrade in progress."""
    return html.Div(
        [
            html.Button("Confirm", id="upgrade-confirm-button", className="btn", disabled=True),
            dcc.ConfirmDialog(id="upgrade-confirm-dialog"),
            html.Button("Roll back", id="upgrade-rollback-button", className="btn btn-danger"),
            dcc.ConfirmDialog(id="upgrade-rollback-dialog"),
            result_slot("upgrade-confirm-result"),
            result_slot("upgrade-rollback-result"),
        ],
        className="control-group upgrade-actions",
    )
