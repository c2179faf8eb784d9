"""Plain Django views: the health endpoint, the home page, the audit log page and JSON error pages
for the API."""

import hmac
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults
from django.views.decorators.cache import never_cache

from console.models import Node, RecoveryEpisode
from console.redis import redis_client
from console.roles import ADMIN, has_role
from console.services import audit_log
from console.services.health import health_report
from console.services.prometheus import exposition
from console.services.teams import jobs_visible_to

# The Prometheus text format, version 0.0.4.
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@never_cache
def healthz(request):
    """200 when the database, Redis and a Celery worker answer; 503 naming what failed."""
    healthy, report = health_report()
    return JsonResponse(report, status=200 if healthy else 503)


@never_cache
def metrics(request):
    """Prometheus scrape endpoint: `Authorization: Bearer <METRICS_TOKEN>`. Off (404) while no
    token is set; 401 with a wrong or missing token. GET only."""
    token = settings.METRICS_TOKEN
    if not token:
        return _json_error(404, "not_found", "metrics are off: set METRICS_TOKEN to turn them on")
    if request.method != "GET":
        return _json_error(405, "method_not_allowed", "GET only")
    given = request.headers.get("Authorization", "").removeprefix("Bearer ")
    if not hmac.compare_digest(given.encode(), token.encode()):
        return _json_error(401, "not_authenticated", "send Authorization: Bearer <METRICS_TOKEN>")
    return HttpResponse(exposition(redis_client()), content_type=PROMETHEUS_CONTENT_TYPE)


@login_required
def home(request):
    """Landing page: what is running and where to go next."""
    return render(
        request,
        "home.html",
        {
            "jobs": jobs_visible_to(request.user)[:20],
            "nodes": Node.objects.all(),
            "open_recoveries": RecoveryEpisode.objects.filter(
                watched_s__isnull=True, job__in=jobs_visible_to(request.user).values("pk")
            ).count(),
        },
    )


# Paths whose clients read JSON: errors there are JSON too, elsewhere the templates' pages.
JSON_PREFIXES = ("/api/", "/django_plotly_dash/")


def _json_error(status: int, code: str, detail: str) -> JsonResponse:
    body = {"error": {"status": status, "code": code, "detail": detail}}
    return JsonResponse(body, status=status)


def _wants_json(request) -> bool:
    return request.path.startswith(JSON_PREFIXES)


def bad_request(request, exception=None):
    """400 (e.g. a host not in ALLOWED_HOSTS, a malformed body): JSON for API clients."""
    if _wants_json(request):
        return _json_error(400, "bad_request", "bad request: malformed or incomplete")
    return defaults.bad_request(request, exception)


def permission_denied(request, exception=None):
    """403: JSON for API clients, the 403 page (with the reason) elsewhere."""
    if _wants_json(request):
        return _json_error(403, "permission_denied", str(exception or "not allowed"))
    return defaults.permission_denied(request, exception)


def api_not_found(request, exception=None):
    """404 for unknown paths: JSON under /api/, the 404 page elsewhere."""
    if _wants_json(request):
        return _json_error(404, "not_found", "no such API resource")
    return defaults.page_not_found(request, exception)


def server_error(request):
    """500: JSON for API clients, the 500 page elsewhere; never a traceback (see the log)."""
    if _wants_json(request):
        return _json_error(500, "server_error", "internal server error")
    return defaults.server_error(request)


AUDIT_PAGE_SIZE = 50


@login_required
def audit_log_page(request):
    """The audit log (admins): search by actor, action, target text and time, newest first,
    AUDIT_PAGE_SIZE events a page, with links to the same search exported by the API."""
    if not has_role(request.user, ADMIN):
        raise PermissionDenied("the audit log is for admins")
    query = {
        name: request.GET.get(name, "").strip()
        for name in ("actor", "action", "text", "since", "until")
    }
    times, errors = {}, []
    for name in ("since", "until"):
        if query[name]:
            try:
                times[name] = audit_log.parse_time(query[name])
            except ValueError:
                errors.append(f"{name}: not a date and time: {query[name][:40]!r}")
    events = audit_log.search(
        **times, actor=query["actor"], action=query["action"], text=query["text"]
    )
    page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    # The API's export takes the same filters but the target text (which it has no use for).
    export = urlencode({k: v for k, v in query.items() if v and k != "text"})
    here = urlencode({k: v for k, v in query.items() if v})
    return render(
        request,
        "audit.html",
        {
            "page": page,
            "query": query,
            "errors": errors,
            "actions": audit_log.actions(),
            "export": export,
            "here": here,
            "section": "audit",
        },
        status=400 if errors else 200,
    )
