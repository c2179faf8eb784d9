"""The placement page's DjangoDash app: which callback reads and writes which component."""

from dash import Input, Output, State
from django_plotly_dash import DjangoDash

from console.dash.placement import callbacks, layout
from console.dash.sharing import share_refresh

APP_NAME = "backstop-placement"

# Controls are added after load for admins only, so their ids are not in the first layout.
app = DjangoDash(APP_NAME, suppress_callback_exceptions=True)
app.layout = layout.layout

share_refresh(
    app,
    APP_NAME,
    callbacks.refresh,
    [
        Output("reserve-summary", "children"),
        Output("idle", "figure"),
        Output("q", "figure"),
        Output("q-scale", "children"),
        Output("node-cards", "children"),
        Output("node-count", "children"),
        Output("standby-table", "children"),
        Output("policy-table", "children"),
        Output("predictor-table", "children"),
        Output("host-reserve", "children"),
    ],
    [Input("refresh", "n_intervals"), Input("node-show", "value"), Input("node-job", "value")],
)
app.callback(Output("controls", "children"), Input("url", "pathname"))(callbacks.render_controls)
app.callback(
    Output("threshold-confirm", "displayed"),
    Output("threshold-confirm", "message"),
    Input("threshold-button", "n_clicks"),
    State("threshold-field", "value"),
    State("threshold-value", "value"),
    prevent_initial_call=True,
)(callbacks.ask_threshold)
app.callback(
    Output("threshold-result", "children"),
    Input("threshold-confirm", "submit_n_clicks"),
    State("threshold-field", "value"),
    State("threshold-value", "value"),
    State("threshold-reason", "value"),
    prevent_initial_call=True,
)(callbacks.threshold_confirmed)
