"""Django views that host the Dash pages: login required, one template per page."""

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.middleware.csrf import get_token
from django.shortcuts import render

from console.dash.alerting.app import APP_NAME as ALERTING_APP
from console.dash.job.app import APP_NAME as JOB_APP
from console.dash.overview.app import APP_NAME as OVERVIEW_APP
from console.dash.placement.app import APP_NAME as PLACEMENT_APP
from console.dash.recoveries.app import APP_NAME as RECOVERIES_APP
from console.dash.resources.app import APP_NAME as RESOURCES_APP
from console.roles import OPERATOR, has_role
from console.services.teams import visible_job_or_404


def _page(request, template: str, app_name: str, section: str, **context):
    # Sets the CSRF cookie: Dash's callback requests send its token back (console.dash.access).
    get_token(request)
    return render(
        request,
        template,
        {"dash_app": app_name, "section": section, **context},
    )


@login_required
def overview(request):
    """Jobs, episodes, nodes and cluster utilisation."""
    return _page(request, "console/page.html", OVERVIEW_APP, "overview", title="Overview")


@login_required
def job(request, job_id: int):
    """One job: DAG, operator table and history, decisions, failures, fault controls."""
    the_job = visible_job_or_404(request.user, job_id)
    return _page(
        request, "console/page.html", JOB_APP, "job", title=f"Job {the_job.name}", job=the_job
    )


@login_required
def placement(request):
    """Nodes by Q with idle rates, primaries and standbys, and the reserve."""
    return _page(request, "console/page.html", PLACEMENT_APP, "placement", title="Placement")


@login_required
def recoveries(request):
    """Recovery timelines, episodes and the strategy comparison."""
    return _page(request, "console/page.html", RECOVERIES_APP, "recoveries", title="Recoveries")


@login_required
def resources(request):
    """CPU, memory, disk and network per node over time."""
    return _page(request, "console/page.html", RESOURCES_APP, "resources", title="Resources")


@login_required
def alerting(request):
    """Alert routes and their deliveries (operators and admins, as in the API)."""
    if not has_role(request.user, OPERATOR):
        raise PermissionDenied("alert routes and deliveries are for operators and admins")
    return _page(request, "console/page.html", ALERTING_APP, "alerts", title="Alerts")
