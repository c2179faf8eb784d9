"""Resources callbacks: node metrics over time, downsampled in the database.

Called by Dash (wired in resources/app.py) and directly by tests; `user` is the Django user.
"""

from __future__ import annotations

from dash.exceptions import PreventUpdate

from console.dash import data
from console.dash.common import DEFAULT_WINDOW_S, MAX_POINTS, can_view
from console.dash.resources import figures
from console.models import Node

# Up to this many nodes every node gets a line; beyond, the chosen nodes (or the busiest) over
# the band of all of them.
MAX_NODE_LINES = 8
BUSIEST = 5


def chosen_nodes(value, nodes: dict[int, str]) -> list[int]:
    """The node ids picked in the dropdown that exist (a forged value picks nothing)."""
    values = value if isinstance(value, list) else [value]
    return [
        v for v in dict.fromkeys(values) if isinstance(v, int) and not isinstance(v, bool)
        and v in nodes
    ]  # fmt: skip


def refresh(n_intervals, window_s, chosen=None, user=None):
    """Every 2 s: CPU, memory, disk and network of each node over the chosen window; at fleet
    size the chosen nodes (else the busiest by CPU) over the range of all nodes."""
    if not can_view(user):
        raise PreventUpdate
    window_s = window_s or DEFAULT_WINDOW_S
    nodes = dict(Node.objects.order_by("name").values_list("pk", "name"))
    # At fleet size the band and a few lines are drawn; half the points keep the figure small.
    points = MAX_POINTS if len(nodes) <= MAX_NODE_LINES else MAX_POINTS // 2
    width = data.bucket_width(window_s, points)
    picked = chosen_nodes(chosen, nodes)
    band = None
    if picked:
        lines, which = picked, f"lines: the {len(picked)} chosen"
    elif len(nodes) > MAX_NODE_LINES:
        means = data.node_means("cpu_util", window_s, list(nodes))
        lines = sorted(means, key=lambda pk: (-means[pk], nodes.get(pk, "")))[:BUSIEST]
        which = f"lines: the {len(lines)} busiest by CPU over the window (choose others above)"
    else:
        lines, which = None, ""
    if lines is not None and len(nodes) > len(lines):
        band = data.node_band(data.NODE_UTIL_METRICS, window_s, points, list(nodes))
    frame = data.metric_series(
        data.NODE_UTIL_METRICS,
        window_s,
        max_points=points,
        node_ids=list(nodes) if lines is None else lines,
    )
    note = f"{len(nodes)} nodes; each point is the average of {width} s of samples."
    if band is not None:
        note += f" {which}; grey band: lowest to highest of all nodes, dashed: their mean."
    elif lines is not None:
        note += f" {which}."
    return figures.resources_figure(frame, nodes, lines, band), note


def node_options(pathname, user=None):
    """Every node, for the node picker."""
    if not can_view(user):
        raise PreventUpdate
    return [{"label": name, "value": pk} for pk, name in Node.objects.values_list("pk", "name")]
