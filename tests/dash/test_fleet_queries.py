"""No query per row: the console's pages, the API's lists and /metrics make as many database
queries for 200 jobs on 50 nodes as for 10 jobs on 10 nodes.

Each path is called once to warm up (the policy's first version, sessions), then counted with
Django's CaptureQueriesContext on a small fleet, then again after a larger fleet joined it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from bench.fleet.seed import seed_fleet
from console.dash.overview import callbacks as overview
from console.dash.placement import callbacks as placement
from console.dash.resources import callbacks as resources
from console.roles import VIEWER
from console.services.policy import change_policy
from console.services.reports import build_report
from console.services.shared_data import invalidate_all

pytestmark = pytest.mark.django_db

TOKEN = "fleet-scrape-token"


def paths(users, api_as, client):
    """name -> a call of one page callback or endpoint."""
    viewer = users[VIEWER]
    api = api_as(VIEWER)

    def get(http, url, **extra):
        def call():
            response = http.get(url, **extra)
            assert response.status_code == 200, (url, response.content[:300])

        return call

    return {
        "overview refresh": lambda: overview.refresh(1, 900, user=viewer),
        "overview filtered": lambda: overview.refresh(
            1, 900, "a", ["running"], ["adaptive"], None, None, ["open"], "throughput", 2,
            user=viewer,
        ),
        "overview filter options": lambda: overview.filter_options("/console/", user=viewer),
        "placement refresh": lambda: placement.refresh(1, user=viewer),
        "placement filtered": lambda: placement.refresh(1, "busy", "adaptive", user=viewer),
        "resources refresh": lambda: resources.refresh(1, 900, user=viewer),
        "api jobs": get(api, "/api/jobs/"),
        "api jobs filtered": get(
            api, "/api/jobs/?status=running,starting&ordering=p99&open_recovery=false&limit=50"
        ),
        "api fleet": get(api, "/api/fleet/"),
        "api nodes": get(api, "/api/nodes/?state=up&ordering=-last_heartbeat"),
        "api recoveries": get(api, "/api/recoveries/?open=false"),
        "metrics": get(client, "/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"),
        "report figures": lambda: build_report(timezone.now() - timedelta(days=1), timezone.now()),
    }  # fmt: skip


def count_queries(calls) -> dict[str, int]:
    counts = {}
    for name, call in calls.items():
        invalidate_all()  # count what computing the shared data costs, not reading it
        with CaptureQueriesContext(connection) as captured:
            call()
        counts[name] = len(captured.captured_queries)
    return counts


def test_query_counts_do_not_grow_with_the_fleet(users, api_as, client, settings):
    settings.METRICS_TOKEN = TOKEN
    calls = paths(users, api_as, client)
    small = seed_fleet(jobs=10, nodes=10, minutes=1)
    change_policy({"priority_threshold": 0.5}, user=None, reason="one change to report")
    count_queries(calls)  # warm up
    at_small = count_queries(calls)
    large = seed_fleet(jobs=190, nodes=40, minutes=1, prefix="b")
    for threshold in (0.45, 0.5, 0.55):  # more versions to report, as many queries
        change_policy({"priority_threshold": threshold}, user=None, reason="more changes")
    at_large = count_queries(calls)
    jobs, nodes = len(small.jobs) + len(large.jobs), len(small.nodes) + len(large.nodes)
    assert (jobs, nodes) == (200, 50)
    print()
    for name in calls:
        print(f"  {name}: {at_small[name]} queries at 10 jobs / 10 nodes, "
              f"{at_large[name]} at {jobs} jobs / {nodes} nodes")  # fmt: skip
    assert at_large == at_small
    # And few in absolute terms: a page's refresh is a handful of queries, not one per row.
    assert max(at_large.values()) <= 20, at_large
