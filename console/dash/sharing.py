"""Refresh callbacks every viewer shares, answered from shared data (console.services.shared_data).

A page's periodic refresh reads nothing of the user but the teams whose jobs they see (the viewer
role is checked before any callback runs), so two viewers of the same teams with the same inputs
get the same answer; the teams (console.services.teams.scope_key) are part of the key.
`share_refresh` registers such a callback on its app with one more output, the data's age;
`shared_response` answers its update requests with the response another viewer's request
computed within the refresh interval: the callback, Dash's dispatch, the figures' JSON and
django-plotly-dash's session write all run once per interval, however many watch.

The key is made of the callback's declared inputs only: a shared refresh request must name
exactly those inputs, in their order, and no state (what Dash's renderer sends); anything else is
refused with a 400 naming what is wrong, so a hand-made request cannot store an entry per made-up
input. The refresh timer's `n_intervals` is left out of the key (every viewer's count differs);
every other input's value (window, filters, the job in the URL) is part of it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from dash import Output, html
from django.http import HttpResponse

from console.clock import utc
from console.dash.common import REFRESH_MS, WINDOWS
from console.services.shared_data import entry_key, shared

REFRESH_S = REFRESH_MS / 1000
DATA_AGE = ("data-age", "children")
TIMER_INPUT = "refresh.n_intervals"
WINDOW_INPUT = "window.value"
# The time windows the pages offer (None: the page's default); any other is refused rather than
# computed and stored under a key of its own.
WINDOW_VALUES = {None, *(w["value"] for w in WINDOWS)}
# App name -> output key (as Dash requests name them) of each shared callback -> its inputs,
# as "id.property", in the order the callback declares them.
_SHARED_OUTPUTS: dict[str, dict[str, tuple[str, ...]]] = {}


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
    declared = tuple(f"{i.component_id}.{i.component_property}" for i in inputs)
    _SHARED_OUTPUTS.setdefault(app_name, {})[output_key(every_output)] = declared


def is_shared(app_name: str, body: dict) -> bool:
    """Whether this update request is for a shared refresh callback."""
    return body.get("output") in _SHARED_OUTPUTS.get(app_name, ())


def _entry_name(entry) -> str:
    """The "id.property" of one input of a request (a pattern-matching id as its JSON)."""
    ident = entry.get("id")
    ident = ident if isinstance(ident, str) else json.dumps(ident, sort_keys=True)
    return f"{ident}.{entry.get('property')}"


def shared_request_problem(app_name: str, body: dict) -> str | None:
    """Why a shared refresh request is not one Dash's renderer sends (its inputs are not exactly
    the callback's, in order, or it carries state), or None when it is one."""
    declared = _SHARED_OUTPUTS[app_name][body["output"]]
    sent = tuple(_entry_name(e) for e in body.get("inputs", []))
    if sent != declared:
        return f"inputs: this callback takes exactly {', '.join(declared)}, in that order"
    if body.get("state"):
        return "state: this callback takes none"
    for name, entry in zip(declared, body["inputs"], strict=True):
        value = entry.get("value")
        hashable = not isinstance(value, list | dict)
        if name == WINDOW_INPUT and not (hashable and value in WINDOW_VALUES):
            offered = ", ".join(str(w["value"]) for w in WINDOWS)
            return f"inputs: {WINDOW_INPUT} must be one of {offered} (seconds)"
    return None


def _inputs_key(app_name: str, body: dict) -> list:
    """The values of the declared inputs (checked by `shared_request_problem`), timer aside."""
    declared = _SHARED_OUTPUTS[app_name][body["output"]]
    inputs = zip(declared, body["inputs"], strict=True)
    values = [entry.get("value") for name, entry in inputs if name != TIMER_INPUT]
    return [app_name, body["output"], values]


def shared_response(app_name: str, body: dict, respond, scope: str) -> HttpResponse:
    """The response of `respond()` (the Dash update view) for this request's inputs, computed at
    most once per refresh interval for every viewer who sees the same jobs (`scope`:
    console.services.teams.scope_key); only complete (200) answers are shared."""

    def compute():
        response = respond()
        # Shared entries are JSON (console.services.shared_data): the body as text. Dash answers
        # updates in JSON, which is UTF-8.
        return response.status_code, response.content.decode("utf-8"), response.get("Content-Type")

    answer = shared(
        entry_key("dash", [scope, *_inputs_key(app_name, body)]),
        REFRESH_S,
        compute,
        keep=lambda value: value[0] == 200,
    )
    status, content, content_type = answer.value
    response = HttpResponse(content.encode("utf-8"), status=status, content_type=content_type)
    response["X-Data-Computed-At"] = utc(answer.computed_at).isoformat()
    return response
