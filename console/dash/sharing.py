"""Refresh callbacks every viewer shares, answered from shared data (console.services.shared_data).

A page's periodic refresh reads nothing of the user (the viewer role, checked before any callback
runs, is all it needs), so two viewers with the same inputs get the same answer. `share_refresh`
registers such a callback on its app with one more output, the data's age; `shared_response`
answers its update requests with the response another viewer's request computed within the
refresh interval: the callback, Dash's dispatch, the figures' JSON and django-plotly-dash's
session write all run once per interval, however many watch.

The refresh timer's `n_intervals` is left out of the key (every viewer's count differs); every
other input (window, filters, the job in the URL) is part of it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from dash import Output, html
from django.http import HttpResponse

from console.dash.common import REFRESH_MS
from console.services.shared_data import entry_key, shared

REFRESH_S = REFRESH_MS / 1000
DATA_AGE = ("data-age", "children")
TIMER_INPUT = "refresh.n_intervals"
# App name -> the output keys (as Dash requests name them) of its shared callbacks.
_SHARED_OUTPUTS: dict[str, set[str]] = {}


def output_key(outputs) -> str:
    """How Dash's renderer names a callback's outputs in an update request."""
    if len(outputs) == 1:
        return str(outputs[0])
    return ".." + "...".join(str(output) for output in outputs) + ".."


def data_age(computed_at: datetime):
    """When the data was computed; static/data-age.js turns it into "data 1 s old" each second."""
    stamp = computed_at.astimezone(UTC)
    return html.Span(
        f"data as of {stamp:%H:%M:%S} UTC",
        className="data-age",
        title=f"computed once every {REFRESH_S:g} s for every viewer of this page",
        **{"data-as-of": stamp.isoformat(timespec="milliseconds")},
    )


def share_refresh(app, app_name: str, callback, outputs: list[Output], inputs: list) -> None:
    """Register `callback` on `app` as a refresh every viewer shares, with the data-age output
    appended (the layout must hold an element with id "data-age")."""
    every_output = [*outputs, Output(*DATA_AGE)]

    # *args + keyword-only `user`: django-plotly-dash passes the user by this signature.
    def with_age(*args, user=None):
        result = callback(*args, user=user)
        return (*result, data_age(datetime.now(UTC)))

    with_age.__name__ = getattr(callback, "__name__", "refresh")
    app.callback(*every_output, *inputs)(with_age)
    _SHARED_OUTPUTS.setdefault(app_name, set()).add(output_key(every_output))


def is_shared(app_name: str, body: dict) -> bool:
    """Whether this update request is for a shared refresh callback."""
    return body.get("output") in _SHARED_OUTPUTS.get(app_name, ())


def _inputs_key(app_name: str, body: dict) -> list:
    def values(entries):
        return [
            [json.dumps(e.get("id"), sort_keys=True), e.get("property"), e.get("value")]
            for e in entries
            if isinstance(e, dict) and f"{e.get('id')}.{e.get('property')}" != TIMER_INPUT
        ]

    return [app_name, body["output"], values(body.get("inputs", [])), values(body.get("state", []))]


def shared_response(app_name: str, body: dict, respond) -> HttpResponse:
    """The response of `respond()` (the Dash update view) for this request's inputs, computed at
    most once per refresh interval for every viewer; only complete (200) answers are shared."""

    def compute():
        response = respond()
        return response.status_code, bytes(response.content), response.get("Content-Type")

    answer = shared(
        entry_key("dash", _inputs_key(app_name, body)),
        REFRESH_S,
        compute,
        keep=lambda value: value[0] == 200,
    )
    status, content, content_type = answer.value
    response = HttpResponse(content, status=status, content_type=content_type)
    response["X-Data-Computed-At"] = datetime.fromtimestamp(answer.computed_at, UTC).isoformat()
    return response
