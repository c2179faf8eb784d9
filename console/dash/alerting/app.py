"""The alerting page's DjangoDash app: which callback reads and writes which component."""

from dash import Input, Output
from django_plotly_dash import DjangoDash

from console.dash.alerting import callbacks, layout

APP_NAME = "backstop-alerting"

app = DjangoDash(APP_NAME)
app.layout = layout.layout

# Not shared between viewers (console.dash.sharing): only operators may read it.
app.callback(
    Output("alerts-table", "children"),
    Output("routes-table", "children"),
    Output("deliveries-chart", "figure"),
    Output("deliveries-table", "children"),
    Input("refresh", "n_intervals"),
    Input("delivery-status", "value"),
)(callbacks.refresh)
