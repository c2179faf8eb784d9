"""The job page's DjangoDash app: which callback reads and writes which component."""

from dash import Input, Output, State
from django_plotly_dash import DjangoDash

from console.dash.job import callbacks, layout
from console.dash.sharing import share_refresh

APP_NAME = "backstop-job"

# Controls are added after load for operators only, so their ids are not in the first layout.
app = DjangoDash(APP_NAME, suppress_callback_exceptions=True)
app.layout = layout.layout

# What the refresh callback writes, in the order callbacks.refresh returns it; every viewer
# shares it, and the data's age follows (console.dash.sharing; the load test sends the same
# request a browser does, from this list).
REFRESH_OUTPUTS = [
    ("summary", "children"),
    ("job-failure", "children"),
    ("dag", "figure"),
    ("replicas-table", "children"),
    ("operators-table", "children"),
    ("history", "figure"),
    ("decisions-table", "children"),
    ("failures-table", "children"),
    ("faults-table", "children"),
    ("upgrade-card", "hidden"),
    ("upgrade-panel", "children"),
    ("upgrade-under-way", "data"),
    ("upgrades-table", "children"),
    ("kafka-card", "hidden"),
    ("kafka-panel", "children"),
    ("app-card", "hidden"),
    ("app-queries", "children"),
    ("app-rates", "figure"),
    ("app-output", "children"),
]

share_refresh(
    app,
    APP_NAME,
    callbacks.refresh,
    [Output(component, prop) for component, prop in REFRESH_OUTPUTS],
    [Input("refresh", "n_intervals"), Input("window", "value"), Input("url", "pathname")],
)
app.callback(Output("controls", "children"), Input("url", "pathname"))(callbacks.render_controls)
app.callback(
    Output("fault-operator", "disabled"),
    Output("fault-node", "disabled"),
    Input("fault-kind", "value"),
)(callbacks.target_fields)
app.callback(
    Output("fault-confirm", "displayed"),
    Output("fault-confirm", "message"),
    Input("fault-button", "n_clicks"),
    State("fault-kind", "value"),
    State("fault-operator", "value"),
    State("fault-node", "value"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.ask_fault)
app.callback(
    Output("fault-result", "children"),
    Input("fault-confirm", "submit_n_clicks"),
    State("fault-kind", "value"),
    State("fault-operator", "value"),
    State("fault-node", "value"),
    State("fault-duration", "value"),
    State("url", "pathname"),
    State("fault-workers", "value"),
    prevent_initial_call=True,
)(callbacks.inject_confirmed)
app.callback(
    Output("stop-confirm", "displayed"),
    Output("stop-confirm", "message"),
    Input("stop-button", "n_clicks"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.ask_stop)
app.callback(
    Output("stop-result", "children"),
    Input("stop-confirm", "submit_n_clicks"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.stop_confirmed)
app.callback(
    Output("restart-confirm", "displayed"),
    Output("restart-confirm", "message"),
    Input("restart-button", "n_clicks"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.ask_restart)
app.callback(
    Output("restart-result", "children"),
    Input("restart-confirm", "submit_n_clicks"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.restart_confirmed)
app.callback(
    Output("upgrade-confirm", "displayed"),
    Output("upgrade-confirm", "message"),
    Input("upgrade-button", "n_clicks"),
    State("upgrade-version", "value"),
    State("upgrade-params", "value"),
    State("upgrade-result-preserving", "value"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.ask_upgrade)
app.callback(
    Output("upgrade-result", "children"),
    Input("upgrade-confirm", "submit_n_clicks"),
    State("upgrade-version", "value"),
    State("upgrade-params", "value"),
    State("upgrade-result-preserving", "value"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.upgrade_confirmed)
app.callback(
    Output("strategy-confirm", "displayed"),
    Output("strategy-confirm", "message"),
    Input("strategy-button", "n_clicks"),
    State("strategy-choice", "value"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.ask_strategy)
app.callback(
    Output("strategy-result", "children"),
    Input("strategy-confirm", "submit_n_clicks"),
    State("strategy-choice", "value"),
    State("url", "pathname"),
    prevent_initial_call=True,
)(callbacks.strategy_confirmed)
# Confirm and Roll back exist for operators only; for a viewer these callbacks have no outputs
# on the page, and Dash does not call them.
app.callback(Output("upgrade-actions", "children"), Input("url", "pathname"))(
    callbacks.render_upgrade_actions
)
app.callback(
    Output("upgrade-confirm-button", "disabled"),
    Output("upgrade-rollback-button", "disabled"),
    Input("upgrade-under-way", "data"),
)(callbacks.end_buttons)
app.callback(
    Output("upgrade-confirm-dialog", "displayed"),
    Output("upgrade-confirm-dialog", "message"),
    Input("upgrade-confirm-button", "n_clicks"),
    State("upgrade-under-way", "data"),
    prevent_initial_call=True,
)(callbacks.ask_confirm_upgrade)
app.callback(
    Output("upgrade-confirm-result", "children"),
    Input("upgrade-confirm-dialog", "submit_n_clicks"),
    State("upgrade-under-way", "data"),
    prevent_initial_call=True,
)(callbacks.confirm_upgrade_confirmed)
app.callback(
    Output("upgrade-rollback-dialog", "displayed"),
    Output("upgrade-rollback-dialog", "message"),
    Input("upgrade-rollback-button", "n_clicks"),
    State("upgrade-under-way", "data"),
    prevent_initial_call=True,
)(callbacks.ask_roll_back_upgrade)
app.callback(
    Output("upgrade-rollback-result", "children"),
    Input("upgrade-rollback-dialog", "submit_n_clicks"),
    State("upgrade-under-way", "data"),
    prevent_initial_call=True,
)(callbacks.roll_back_confirmed)
