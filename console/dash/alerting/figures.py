"""The alerting page's figure and table rows, from plain dicts (no Django, no Dash I/O)."""

from __future__ import annotations

import plotly.graph_objects as go

STATUS_COLOURS = {"delivered": "#2e7d32", "pending": "#f9a825", "failed": "#c62828"}


def deliveries_figure(counts: list[dict]) -> go.Figure:
    """Deliveries per route, stacked by status; `counts`: {"route", "status", "n"} rows."""
    routes = sorted({row["route"] for row in counts})
    figure = go.Figure()
    for status, colour in STATUS_COLOURS.items():
        by_route = {row["route"]: row["n"] for row in counts if row["status"] == status}
        figure.add_bar(
            name=status,
            x=routes,
            y=[by_route.get(route, 0) for route in routes],
            marker_color=colour,
        )
    figure.update_layout(
        barmode="stack",
        title="Deliveries per route (last 24 h)",
        height=260,
        margin={"l": 40, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.25},
        yaxis_title="deliveries",
    )
    return figure


def alert_cells(alert: dict, fmt_time) -> list[str]:
    """One open alert's table cells; `fmt_time` formats its datetimes."""
    return [
        fmt_time(alert["opened_at"]),
        f"{alert['event']} ({alert['severity']})",
        alert["summary"],
        str(alert["seen"]),
        fmt_time(alert["last_seen_at"]),
        alert["key"],
    ]


def route_cells(route: dict) -> list[str]:
    """One route's table cells."""
    return [
        route["name"],
        route["channel"],
        route["target"],
        ", ".join(route["events"]) or "every event",
        f"{route['min_severity']} and up",
        ", ".join(route["teams"] + [f"job {pk}" for pk in route["jobs"]]) or "every job",
        "on" if route["enabled"] else "off",
    ]


def delivery_cells(delivery: dict, fmt_time) -> list[str]:
    """One delivery's table cells; `fmt_time` formats its datetimes. The status says when it
    was delivered, or when a pending one is tried next."""
    status = delivery["status"]
    if status == "delivered":
        status += f" {fmt_time(delivery['delivered_at'])}"
    elif status == "pending" and delivery["attempts"]:
        status += f", next try {fmt_time(delivery['next_attempt_at'])}"
    if delivery["response_status"]:
        status += f" (HTTP {delivery['response_status']})"
    return [
        fmt_time(delivery["created_at"]),
        delivery["route"],
        f"{delivery['event']} ({delivery['severity']})",
        delivery["action"],
        status,
        str(delivery["attempts"]),
        delivery["last_error"] or "—",
        delivery["alert_key"],
    ]
