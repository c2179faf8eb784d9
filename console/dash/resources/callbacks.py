"""Resources callbacks: node metrics over time, downsampled in the database.

Called by Dash (wired in resources/app.py) and directly by tests; `user` is the Django user.
"""

from __future__ import annotations

from dash.exceptions import PreventUpdate

from console.dash import data
from console.dash.common import DEFAULT_WINDOW_S, MAX_POINTS, can_view
from console.dash.resources import figures
from console.models import Node


def refresh(n_intervals, window_s, user=None):
    """Every 2 s: CPU, memory, disk and network of each node over the chosen window."""
    if not can_view(user):
        raise PreventUpdate
    window_s = window_s or DEFAULT_WINDOW_S
    nodes = dict(Node.objects.values_list("pk", "name"))
    frame = data.metric_series(
        data.NODE_UTIL_METRICS, window_s, max_points=MAX_POINTS, node_ids=list(nodes)
    )
    width = data.bucket_width(window_s, MAX_POINTS)
    note = f"{len(nodes)} nodes; each point is the average of {width} s of samples."
    return figures.resources_figure(frame, nodes), note
