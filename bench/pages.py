"""The one timing of the console's pages and API endpoints, for `manage.py fleet_sim` (after its
run, on what the run left) and `manage.py page_timing` (on a seeded fleet of a given size).

A page is what its server answers for one view of it: the page itself and the Dash callback that
brings it its data (the page is nothing without it), or one API endpoint. Requests go through
Django's test Client in this process, so the figures are server time without a network. Each
request finds the shared page data stale (console.services.shared_data): the figures are what the
computation costs, not a cache read.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from django.test import Client
from django_plotly_dash.dash_wrapper import get_local_stateless_by_name

from console.dash.overview.app import APP_NAME as OVERVIEW_APP
from console.dash.placement.app import APP_NAME as PLACEMENT_APP
from console.dash.resources.app import APP_NAME as RESOURCES_APP
from console.services.shared_data import invalidate_all
from spark_runtime.progress import percentiles

DASH_UPDATE = "/django_plotly_dash/app/{app}/_dash-update-component"
# The pages the fleet simulator times (its fleet.json and RESULTS.md section name these).
FLEET_SIM_PAGES = ("overview", "jobs_api", "placement", "metrics")


@dataclass(frozen=True)
class Request:
    """One request of a page: GET or POST (a Dash callback's JSON body) to `path`."""

    method: str
    path: str
    body: dict | None = None
    headers: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.method} {self.path}"


def refresh_callback(app_name: str, pathname: str, values: dict | None = None) -> dict:
    """The body of the request a browser showing the page sends for its data: the page's
    callback whose input is the refresh timer, with the layout's first values (or `values`,
    {(component id, property): value}, for a filtered view)."""
    app = get_local_stateless_by_name(app_name)
    for callback, _ in app._callback_sets:
        inputs = [(i.component_id, i.component_property) for i in callback["inputs"]]
        outputs = callback["output"]
        if ("refresh", "n_intervals") not in inputs or not isinstance(outputs, list | tuple):
            continue
        given = {("refresh", "n_intervals"): 1, ("window", "value"): 900,
                 ("url", "pathname"): pathname, **(values or {})}  # fmt: skip
        return {
            "output": ".." + "...".join(str(o) for o in outputs) + "..",
            "outputs": [{"id": o.component_id, "property": o.component_property} for o in outputs],
            "inputs": [
                {"id": cid, "property": prop, "value": given.get((cid, prop))}
                for cid, prop in inputs
            ],
            "state": [],
            "changedPropIds": ["refresh.n_intervals"],
        }
    raise LookupError(f"{app_name} has no refresh callback")


def _dash_page(path: str, app_name: str, values: dict | None = None) -> list[Request]:
    body = refresh_callback(app_name, path, values)
    return [Request("GET", path), Request("POST", DASH_UPDATE.format(app=app_name), body)]


def page_requests(metrics_token: str) -> dict[str, list[Request]]:
    """Every page and endpoint this module can time, by name: the fleet simulator's four
    (FLEET_SIM_PAGES) first, then the other views an operator opens on a large fleet."""
    by_throughput = {("job-sort", "value"): "throughput"}
    return {
        "overview": _dash_page("/console/", OVERVIEW_APP),
        "jobs_api": [Request("GET", "/api/jobs/")],
        "placement": _dash_page("/console/placement/", PLACEMENT_APP),
        "metrics": [
            Request("GET", "/metrics", headers={"HTTP_AUTHORIZATION": f"Bearer {metrics_token}"})
        ],
        "overview_by_throughput": _dash_page("/console/", OVERVIEW_APP, by_throughput),
        "resources": _dash_page("/console/resources/", RESOURCES_APP),
        "running_jobs_by_p99_api": [
            Request("GET", "/api/jobs/?status=running&ordering=p99&limit=50")
        ],
        "fleet_api": [Request("GET", "/api/fleet/")],
        "nodes_api": [Request("GET", "/api/nodes/")],
        "open_recoveries_api": [Request("GET", "/api/recoveries/?open=true")],
    }


def _send(client: Client, request: Request):
    if request.method == "GET":
        return client.get(request.path, **request.headers)
    return client.post(request.path, json.dumps(request.body), content_type="application/json")


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def time_pages(
    user,
    metrics_token: str,
    requests: int = 20,
    pages: tuple[str, ...] = FLEET_SIM_PAGES,
    progress=None,
) -> dict:
    """Server time of `pages` (names of page_requests) as `user` over `requests` rounds after
    one unmeasured round (Dash's first layout, the policy's first read): per page p50, p95 and
    max (ms, the page and its data callback together) and the bytes of its last answers; each
    request's own p95; any error. A page that answered with an error has no times (None).
    `progress(text)` hears of each page when it is timed."""
    plan = page_requests(metrics_token)
    unknown = sorted(set(pages) - set(plan))
    if unknown:
        raise ValueError(f"pages: no page named {', '.join(unknown)} (known: {', '.join(plan)})")
    client = Client()
    client.force_login(user)
    parts: dict[str, list[float]] = {}
    totals: dict[str, list[float]] = {page: [] for page in pages}
    sizes: dict[str, int] = {}
    errors: dict[str, str] = {}
    failed: set[str] = set()
    for page in pages:
        if progress is not None:
            progress(f"timing {page} ({requests} requests)")
        for round_no in range(requests + 1):
            total, size = 0.0, 0
            for request in plan[page]:
                # The cost of the viewer who computes the shared data, not of one who reads it.
                invalidate_all()
                started = time.perf_counter()
                response = _send(client, request)
                elapsed = (time.perf_counter() - started) * 1000
                if response.status_code != 200:
                    errors[request.name] = f"HTTP {response.status_code}"
                    failed.add(page)
                total += elapsed
                size += len(response.content)
                if round_no:
                    parts.setdefault(request.name, []).append(elapsed)
            if round_no:
                totals[page].append(total)
            sizes[page] = size

    def figure(page: str, key: str) -> float | None:
        if page in failed:
            return None
        values = totals[page]
        if key == "max":
            return _ms(max(values, default=None))
        return _ms(percentiles(values, (50, 95))[key])

    return {
        "p50_ms": {page: figure(page, "p50") for page in pages},
        "p95_ms": {page: figure(page, "p95") for page in pages},
        "max_ms": {page: figure(page, "max") for page in pages},
        "bytes": sizes,
        "parts_p95_ms": {name: _ms(percentiles(v, (95,))["p95"]) for name, v in parts.items()},
        "requests": requests,
        "errors": errors,
    }
