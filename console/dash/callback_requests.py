"""What a Dash callback request must look like before Dash sees it.

Dash trusts the browser's renderer: a request of the wrong shape (valid JSON, but `inputs` a
string, an input without `property`, an output no callback writes) raises deep inside Dash and
would answer 500. The middleware asks `callback_request_problem` first and answers 400 naming
what is wrong (console/middleware.py, RequestBodyLimitsMiddleware).
"""

from __future__ import annotations

from django_plotly_dash.dash_wrapper import get_local_stateless_by_name

UPDATE_SUFFIX = "/_dash-update-component"


def _dependency_problem(item, where: str) -> str | None:
    if isinstance(item, list):  # a pattern-matching dependency (ALL) is a list of them
        return next((p for p in (_dependency_problem(i, where) for i in item) if p), None)
    if not isinstance(item, dict):
        return f"{where}: each entry must be an object with id and property"
    if not isinstance(item.get("id"), str | dict) or not isinstance(item.get("property"), str):
        return f"{where}: each entry needs an id and a property (strings)"
    return None


def known_outputs(app_name: str) -> set[str] | None:
    """The output keys the app's callbacks write ("id.prop", or "..a.p...b.q.." for several),
    or None for an app this process does not know (Dash answers those itself)."""
    # The console's pages register their apps when imported; a Dash request may come first.
    import console.dash.views  # noqa: F401

    try:
        app = get_local_stateless_by_name(app_name)
    except KeyError:
        return None
    keys = set()
    for callback, _ in app._callback_sets:
        output = callback["output"]
        if isinstance(output, list | tuple):
            keys.add(".." + "...".join(str(o) for o in output) + "..")
        else:
            keys.add(str(output))
    return keys


def callback_request_problem(app_name: str, body) -> str | None:
    """Why `body` is not a callback request for `app_name`, or None when it is one."""
    if not isinstance(body, dict):
        return "request body: expected a JSON object"
    output = body.get("output")
    if not isinstance(output, str):
        return "output: must be a string naming the callback's outputs"
    known = known_outputs(app_name)
    if known is not None and output not in known:
        return f"output: no callback of this page writes {output[:80]!r}"
    outputs = body.get("outputs", [])
    problem = _dependency_problem(outputs if isinstance(outputs, list) else [outputs], "outputs")
    if problem:
        return problem
    for key in ("inputs", "state"):
        entries = body.get(key, [])
        if not isinstance(entries, list):
            return f"{key}: must be a list"
        problem = _dependency_problem(entries, key)
        if problem:
            return problem
    changed = body.get("changedPropIds", [])
    if not isinstance(changed, list) or not all(isinstance(c, str) for c in changed):
        return "changedPropIds: must be a list of strings"
    return None
