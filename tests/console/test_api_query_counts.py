"""No query per row on the API's hot endpoints: the job list, a job's detail and recoveries, the
fleet's recoveries, the nodes and the fleet's totals make as many database queries for 12 jobs
on 6 nodes, with many operators, replicas, episodes, faults and decisions, as for 2 jobs on 2
nodes with one of each, and no more than the measured count (MAX_QUERIES).

Each request is made as a viewer, once to warm up, then counted with Django's
CaptureQueriesContext on the small fleet and again after the fleet grew. The cache is cleared
before each request, so a cached response never hides the queries behind it. The rows expected
are computed from what tests/dash/query_fleet.py made.
"""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.roles import ADMIN, VIEWER
from tests.dash.query_fleet import Built, build_fleet

pytestmark = pytest.mark.django_db

# Queries per request, whatever the size of the fleet (the counts measured on SQLite and
# PostgreSQL alike; with force_authenticate, so no token lookup, but the role check's query).
# Jobs: role, count, page, operators, replicas with their nodes, 4 fleet totals. Job: role, job,
# operators, replicas with their nodes. Job recoveries: role, job, count, page. Recoveries and
# nodes: role, count, page. Fleet: role, 4 totals. Each also reads the reader's groups once: the
# teams whose jobs they see are part of the shared entry's key (console.services.teams).
MAX_QUERIES = {
    "jobs": 10,
    "job": 5,
    "job recoveries": 5,
    "recoveries": 4,
    "nodes": 4,
    "fleet": 6,
}


def get(api, url: str) -> tuple[int, dict]:
    """(number of queries, JSON body) of one GET that must answer 200."""
    cache.clear()
    with CaptureQueriesContext(connection) as captured:
        response = api.get(url)
    assert response.status_code == 200, (url, response.content[:300])
    return len(captured.captured_queries), response.json()


def endpoints(fleet: Built) -> dict[str, str]:
    """name -> URL; a job's detail and recoveries are those of the fleet's busiest job."""
    job = fleet.jobs[0]
    return {
        "jobs": "/api/jobs/",
        "job": f"/api/jobs/{job.pk}/",
        "job recoveries": f"/api/jobs/{job.pk}/recoveries/",
        "recoveries": "/api/recoveries/",
        "nodes": "/api/nodes/",
        "fleet": "/api/fleet/",
    }


def check_rows(bodies: dict[str, dict], fleets: list[Built]) -> None:
    """Every job, node and episode made is in the answers; the job's operators and replicas."""
    jobs = [job for built in fleets for job in built.jobs]
    busiest, job = fleets[-1], fleets[-1].jobs[0]
    assert bodies["jobs"]["count"] == len(jobs)
    assert {row["id"] for row in bodies["jobs"]["results"]} == {job.pk for job in jobs}
    rows = {row["id"]: row for row in bodies["jobs"]["results"]}
    for built in fleets:
        for each in built.jobs:
            assert len(rows[each.pk]["operators"]) == 4
            assert len(rows[each.pk]["replicas"]) == built.replicas[each.pk]
    detail = bodies["job"]
    assert len(detail["operators"]) == 4
    assert len(detail["replicas"]) == busiest.replicas[job.pk]
    assert {r["node"] for r in detail["replicas"]} <= {n.name for n in busiest.nodes}
    assert bodies["job recoveries"]["count"] == busiest.episodes[job.pk]
    episodes = sum(sum(built.episodes.values()) for built in fleets)
    assert bodies["recoveries"]["count"] == episodes
    assert len(bodies["recoveries"]["results"]) == episodes
    nodes = [node for built in fleets for node in built.nodes]
    assert {row["name"] for row in bodies["nodes"]["results"]} == {n.name for n in nodes}
    assert bodies["fleet"]["jobs"]["total"] == len(jobs)
    assert bodies["fleet"]["open_recoveries"] == sum(
        sum(built.open_episodes.values()) for built in fleets
    )


def test_api_queries_do_not_grow_with_the_fleet(users, api_as):
    api = api_as(VIEWER)
    small = build_fleet(2, 2, prefix="a", per_job=1, samples=3, user=users[ADMIN])
    urls = endpoints(small)
    for url in urls.values():  # warm up
        get(api, url)
    at_small, bodies = {}, {}
    for name, url in urls.items():
        at_small[name], bodies[name] = get(api, url)
    check_rows(bodies, [small])

    large = build_fleet(10, 4, prefix="b", per_job=6, samples=10, user=users[ADMIN])
    urls = endpoints(large)
    at_large = {}
    for name, url in urls.items():
        at_large[name], bodies[name] = get(api, url)
    check_rows(bodies, [small, large])

    print()
    for name in urls:
        print(f"  {name}: {at_small[name]} queries small, {at_large[name]} large")
    assert at_large == at_small
    over = {name: n for name, n in at_large.items() if n > MAX_QUERIES[name]}
    assert not over, f"more queries than {MAX_QUERIES}: {over}"
