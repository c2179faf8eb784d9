"""The recovery timelines' DjangoDash app: which callback reads and writes which component."""

from dash import Input, Output
from django_plotly_dash import DjangoDash

from console.dash.recoveries import callbacks, layout
from console.dash.sharing import share_refresh

APP_NAME = "backstop-recoveries"

app = DjangoDash(APP_NAME)
app.layout = layout.layout

app.callback(Output("jobs", "options"), Input("refresh", "n_intervals"))(callbacks.job_options)
share_refresh(
    app,
    APP_NAME,
    callbacks.refresh,
    [
        Output("timelines", "figure"),
        Output("phases", "figure"),
        Output("episodes-table", "children"),
        Output("strategies", "figure"),
        Output("strategies-table", "children"),
    ],
    [Input("refresh", "n_intervals"), Input("jobs", "value"), Input("window", "value")],
)
