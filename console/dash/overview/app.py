"""The overview's DjangoDash app: which callback reads and writes which component."""

from dash import Input, Output, State
from django_plotly_dash import DjangoDash

from console.dash.overview import callbacks, layout
from console.dash.sharing import share_refresh

APP_NAME = "backstop-overview"

# Controls are added after load for operators only, so their ids are not in the first layout.
app = DjangoDash(APP_NAME, suppress_callback_exceptions=True)
app.layout = layout.layout

FILTERS = [
    Input("job-search", "value"),
    Input("job-status", "value"),
    Input("job-strategy", "value"),
    Input("job-topology", "value"),
    Input("job-node", "value"),
    Input("job-open", "value"),
    Input("job-sort", "value"),
]

share_refresh(
    app,
    APP_NAME,
    callbacks.refresh,
    [
        Output("kpis", "children"),
        Output("jobs-table", "children"),
        Output("episodes-table", "children"),
        Output("nodes-table", "children"),
        Output("utilisation", "figure"),
        Output("throughput", "figure"),
    ],
    [
        Input("refresh", "n_intervals"),
        Input("window", "value"),
        *FILTERS,
        Input("jobs-page", "data"),
    ],
)
app.callback(
    Output("job-topology", "options"),
    Output("job-node", "options"),
    Input("url", "pathname"),
)(callbacks.filter_options)
app.callback(
    Output("jobs-page", "data"),
    Input("jobs-prev", "n_clicks"),
    Input("jobs-next", "n_clicks"),
    *FILTERS,
    State("jobs-page", "data"),
    prevent_initial_call=True,
)(callbacks.turn_page)
app.callback(Output("controls", "children"), Input("url", "pathname"))(callbacks.render_controls)
app.callback(Output("stop-job", "options"), Input("refresh", "n_intervals"))(callbacks.stop_options)
app.callback(
    Output("stop-confirm", "displayed"),
    Output("stop-confirm", "message"),
    Input("stop-button", "n_clicks"),
    State("stop-job", "value"),
    prevent_initial_call=True,
)(callbacks.ask_stop)
app.callback(
    Output("stop-result", "children"),
    Input("stop-confirm", "submit_n_clicks"),
    State("stop-job", "value"),
    prevent_initial_call=True,
)(callbacks.stop_confirmed)
app.callback(
    Output("start-result", "children"),
    Input("start-button", "n_clicks"),
    State("start-name", "value"),
    State("start-topology", "value"),
    State("start-strategy", "value"),
    State("start-rate", "value"),
    State("start-source-topic", "value"),
    State("start-sink-topic", "value"),
    prevent_initial_call=True,
)(callbacks.start_clicked)
