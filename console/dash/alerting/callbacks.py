"""Alerting page callback: thin glue from the alert routing service to the figure and tables.

Routes and deliveries are operators' reading (the API's rule): a viewer's refresh is refused.
"""

from __future__ import annotations

from dash.exceptions import PreventUpdate

from console.dash.alerting import figures
from console.dash.common import fmt_time, table
from console.roles import OPERATOR, has_role
from console.services import alert_routing

ALERT_COLUMNS = ["Opened", "Event", "Summary", "Checks", "Last seen", "Key"]
ROUTE_COLUMNS = ["Route", "Channel", "Target", "Events", "Severity", "Scope", "Enabled"]
DELIVERY_COLUMNS = [
    "Queued",
    "Route",
    "Event",
    "Action",
    "Status",
    "Attempts",
    "Last error",
    "Alert key",
]


def refresh(n_intervals, status, user=None):
    """Every 2 s: the open alerts, the routes, deliveries per route and status, the newest
    deliveries."""
    if not has_role(user, OPERATOR):
        raise PreventUpdate
    routes = alert_routing.route_rows(user)
    deliveries = alert_routing.delivery_rows(user, status=status or None)
    return (
        table(
            ALERT_COLUMNS,
            [figures.alert_cells(alert, fmt_time) for alert in alert_routing.open_alert_rows(user)],
            "Nothing is wrong: no alert is open.",
            table_id="open-alerts",
        ),
        table(
            ROUTE_COLUMNS,
            [figures.route_cells(route) for route in routes],
            "No routes yet: add one in the admin or with POST /api/alert-routes/.",
            table_id="routes",
        ),
        figures.deliveries_figure(alert_routing.delivery_counts(user)),
        table(
            DELIVERY_COLUMNS,
            [figures.delivery_cells(delivery, fmt_time) for delivery in deliveries],
            "No deliveries.",
            table_id="deliveries",
        ),
    )
