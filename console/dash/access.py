"""Who may call the Dash endpoints (django-plotly-dash routes under /django_plotly_dash/).

django-plotly-dash wraps every one of its views with `PLOTLY_DASH["view_decorator"]`; this is
that decorator. It refuses, before Dash sees the request:

- anonymous users and users without a role: the page itself redirects to the login (as every
  console page does), every other Dash endpoint (layout, dependencies, callback updates) answers
  403, so a script without a session gets nothing;
- a POST without a valid CSRF token. django-plotly-dash exempts its update view from Django's
  CSRF check; the check is done here instead, with Django's own middleware. Dash's renderer sends
  the token in the X-CSRFToken header, read from the cookie `_csrf_token` (hence
  CSRF_COOKIE_NAME in the settings). Django's check also refuses a foreign Origin;
- a callback update whose body is not JSON (415): a form or text/plain POST is never Dash;
- a callback update of the wrong shape (400, JSON, naming what is wrong; see
  console.dash.callback_requests): Dash would raise on it.

A page's periodic refresh, once allowed, is answered from the data every viewer shares
(console.dash.sharing): computed at most once per refresh interval, whoever watches. Its request
must name exactly the callback's inputs (400 otherwise), so that made-up inputs cannot add
entries to the shared data.

What a logged-in user may do inside a callback is checked again by each control
(console.dash.controls), which raises PermissionDenied: Django answers 403.
"""

from __future__ import annotations

import functools
import json

from django.contrib.auth.views import redirect_to_login
from django.http import HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware

from console.dash.callback_requests import callback_request_problem
from console.dash.sharing import is_shared, shared_request_problem, shared_response
from console.roles import VIEWER, has_role
from console.services.teams import scope_key

UPDATE_ROUTE = "_dash-update-component"


def _csrf_failure(request) -> HttpResponse | None:
    """Django's CSRF verdict on `request` as if the view were not exempt (None: passes)."""

    def protected_view(request):  # a stand-in without the csrf_exempt mark
        return None

    middleware = CsrfViewMiddleware(lambda req: None)
    return middleware.process_view(request, protected_view, (), {})


def console_access(view_function, *, url_part: str = "", **kwargs):
    """Wrap one django-plotly-dash view: session with a role, CSRF on writes, JSON updates."""

    @functools.wraps(view_function)
    def wrapped(request, *args, **view_kwargs):
        if not request.user.is_authenticated:
            if url_part == "":
                return redirect_to_login(request.get_full_path())
            return HttpResponse("log in first", status=403, content_type="text/plain")
        if not has_role(request.user, VIEWER):
            return HttpResponse("no console role", status=403, content_type="text/plain")
        refusal = _csrf_failure(request)
        if refusal is not None:
            return refusal
        if url_part == UPDATE_ROUTE:
            content_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip()
            if request.method != "POST" or content_type != "application/json":
                return HttpResponse(
                    "callback updates are JSON POSTs", status=415, content_type="text/plain"
                )
            # Valid JSON: RequestBodyLimitsMiddleware answered 400 to anything else.
            body = json.loads(request.body)
            app_name = view_kwargs.get("ident", "")
            problem = callback_request_problem(app_name, body)
            if not problem and is_shared(app_name, body):
                problem = shared_request_problem(app_name, body)
            if problem:
                error = {"status": 400, "code": "bad_request", "detail": problem}
                return JsonResponse({"error": error}, status=400)
            if is_shared(app_name, body):
                return shared_response(
                    app_name,
                    body,
                    lambda: view_function(request, *args, **view_kwargs),
                    scope=scope_key(request.user),
                )
        return view_function(request, *args, **view_kwargs)

    # functools.wraps copies the update view's csrf_exempt mark, so Django's middleware skips
    # this view: the _csrf_failure check above is the one that counts, on every route.
    return wrapped
