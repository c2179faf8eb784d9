"""The resources page's DjangoDash app: which callback reads and writes which component."""

from dash import Input, Output
from django_plotly_dash import DjangoDash

from console.dash.resources import callbacks, layout

APP_NAME = "backstop-resources"

app = DjangoDash(APP_NAME)
app.layout = layout.layout

app.callback(
    Output("resources", "figure"),
    Output("resources-note", "children"),
    Input("refresh", "n_intervals"),
    Input("window", "value"),
    Input("resources-nodes", "value"),
)(callbacks.refresh)
app.callback(Output("resources-nodes", "options"), Input("url", "pathname"))(callbacks.node_options)
