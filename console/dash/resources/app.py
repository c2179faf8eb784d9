"""The resources page's DjangoDash app: which callback reads and writes which component."""

from dash import Input, Output
from django_plotly_dash import DjangoDash

from console.dash.resources import callbacks, layout
from console.dash.sharing import share_refresh

APP_NAME = "backstop-resources"

app = DjangoDash(APP_NAME)
app.layout = layout.layout

share_refresh(
    app,
    APP_NAME,
    callbacks.refresh,
    [Output("resources", "figure"), Output("resources-note", "children")],
    [Input("refresh", "n_intervals"), Input("window", "value"), Input("resources-nodes", "value")],
)
app.callback(Output("resources-nodes", "options"), Input("url", "pathname"))(callbacks.node_options)
