"""Plain Django views: the health endpoint, the home page and JSON error pages for the API."""

from django.contrib.auth.decorators import login_required
from django.http import JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from console.models import Job, Node, RecoveryEpisode
from console.services.health import health_report


@never_cache
def healthz(request):
    """200 when the database, Redis and a Celery worker answer; 503 naming what failed."""
    healthy, report = health_report()
    return JsonResponse(report, status=200 if healthy else 503)


@login_required
def home(request):
    """Landing page: what is running and where to go next."""
    return render(
        request,
        "home.html",
        {
            "jobs": Job.objects.all()[:20],
            "nodes": Node.objects.all(),
            "open_recoveries": RecoveryEpisode.objects.filter(recovered_at__isnull=True).count(),
        },
    )


def api_not_found(request, exception=None):
    """404 for unknown paths: JSON under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"error": {"status": 404, "code": "not_found", "detail": "no such API resource"}},
            status=404,
        )
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)
