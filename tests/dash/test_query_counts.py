"""No query per row on the console's pages: each page's 2 s refresh callback makes as many
database queries for 12 jobs on 6 nodes, with many operators, replicas, episodes, faults,
decisions and samples, as for 2 jobs on 2 nodes with one of each, and no more than the
measured count (MAX_QUERIES: a query more is a regression, a query less is a number to lower).

Each callback is called directly with a viewer, once to warm up, then counted with Django's
CaptureQueriesContext on the small fleet, and again after the fleet grew. The rows expected
in its tables are computed from what tests/dash/query_fleet.py made, not from the page.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.dash.job import callbacks as job_page
from console.dash.overview import callbacks as overview
from console.dash.placement import callbacks as placement
from console.dash.recoveries import callbacks as recoveries
from console.dash.resources import callbacks as resources
from console.roles import ADMIN, VIEWER
from console.services.policy import change_policy
from tests.dash.components import text_of
from tests.dash.query_fleet import build_fleet, table_rows

pytestmark = pytest.mark.django_db

# Queries per refresh, whatever the size of the fleet (the counts measured on SQLite and
# PostgreSQL alike), the viewer's role check included. Overview: role, job count and page, 4
# fleet totals, replicas and nodes, episodes, node ids and cluster use, throughput, policy. Job:
# role, job, operators, replicas, 2 newest values, policy, history, upgrades, decisions,
# failures and their responses, faults. Placement: role, replicas and nodes, policy, standbys,
# the jobs of the standbys the host reserve downgraded, predictor. Recoveries: role, job
# choices, the jobs compared, series, episodes, faults, strategies. Resources: role, nodes,
# series.
MAX_QUERIES = {
    "overview": 14,
    "job": 13,
    "placement": 7,
    "recoveries": 7,
    "resources": 3,
}
OVERVIEW_EPISODES = 20  # the overview lists this many episodes of the last hour at most
JOB_PAGE_ROWS = 30  # the job page's decision, failure and fault tables show this many at most


@pytest.fixture
def fleet(users):
    """`fleet.small()` then `fleet.grow()`: the fleet at its two sizes; the viewer calls."""

    class Sizes:
        viewer = users[VIEWER]

        def small(self):
            # A policy version written by someone, as the placement page shows who wrote it.
            change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="counted")
            self.first = build_fleet(2, 2, prefix="a", per_job=1, samples=3, user=users[ADMIN])
            return self.first

        def grow(self):
            self.second = build_fleet(10, 4, prefix="b", per_job=6, samples=10, user=users[ADMIN])
            return self.second

    return Sizes()


def counted(call):
    """(number of queries, result) of one call."""
    with CaptureQueriesContext(connection) as captured:
        result = call()
    return len(captured.captured_queries), result


def assert_flat(page: str, small: int, large: int) -> None:
    print(f"\n  {page} refresh: {small} queries small, {large} large")
    assert large == small, f"{page}: {small} queries for the small fleet, {large} for the large"
    assert large <= MAX_QUERIES[page], f"{page}: {large} queries, at most {MAX_QUERIES[page]}"


def test_overview_refresh_queries_do_not_grow_with_the_fleet(fleet):
    def refresh():
        return overview.refresh(1, 900, user=fleet.viewer)

    small = fleet.small()
    refresh()  # warm up
    at_small, (_, jobs, episodes, nodes, _, throughput) = counted(refresh)
    assert table_rows(jobs, "jobs") == len(small.jobs)
    assert table_rows(nodes, "nodes") == len(small.nodes)
    assert table_rows(episodes, "episodes") == sum(small.episodes.values())
    assert {trace.name for trace in throughput.data} == {job.name for job in small.jobs}

    large = fleet.grow()
    at_large, (_, jobs, episodes, nodes, _, throughput) = counted(refresh)
    every_job = small.jobs + large.jobs
    assert table_rows(jobs, "jobs") == len(every_job)
    assert table_rows(nodes, "nodes") == len(small.nodes) + len(large.nodes)
    expected_episodes = sum(small.episodes.values()) + sum(large.episodes.values())
    assert table_rows(episodes, "episodes") == min(OVERVIEW_EPISODES, expected_episodes)
    assert len(throughput.data) == overview.THROUGHPUT_LINES
    assert_flat("overview", at_small, at_large)


def test_job_refresh_queries_do_not_grow_with_its_rows(fleet):
    def tables(outputs) -> dict[str, int]:
        _, _, _, replicas, operators, _, decisions, failures, faults, *_ = outputs
        return {
            "replicas": table_rows(replicas, "replicas"),
            "operators": table_rows(operators, "operators"),
            "decisions": table_rows(decisions, "decisions"),
            "failures": table_rows(failures, "failures"),
            "faults": table_rows(faults, "faults"),
        }

    def expected(built, job) -> dict[str, int]:
        return {
            "replicas": built.live_replicas[job.pk],
            "operators": 4,  # source, split, count, sink
            "decisions": min(JOB_PAGE_ROWS, built.decisions[job.pk]),
            "failures": min(JOB_PAGE_ROWS, built.failures[job.pk]),
            "faults": min(JOB_PAGE_ROWS, built.faults[job.pk]),
        }

    small = fleet.small()
    job = small.jobs[0]
    path = f"/console/jobs/{job.pk}/"
    job_page.refresh(1, 900, path, user=fleet.viewer)  # warm up
    at_small, outputs = counted(lambda: job_page.refresh(1, 900, path, user=fleet.viewer))
    assert tables(outputs) == expected(small, job)
    assert "promote: answer 0" in text_of(outputs[7])

    large = fleet.grow()
    job = large.jobs[0]
    path = f"/console/jobs/{job.pk}/"
    at_large, outputs = counted(lambda: job_page.refresh(1, 900, path, user=fleet.viewer))
    assert tables(outputs) == expected(large, job)
    # Each failure still shows the controller's answer to it, by replica or by stage.
    assert all(f"promote: answer {k}" in text_of(outputs[7]) for k in range(6))
    assert_flat("job", at_small, at_large)


def test_placement_refresh_queries_do_not_grow_with_the_fleet(fleet):
    def refresh():
        return placement.refresh(1, user=fleet.viewer)

    small = fleet.small()
    refresh()  # warm up
    at_small, outputs = counted(refresh)
    cards, standbys = outputs[4], outputs[6]
    assert len(cards) == len(small.nodes)
    assert table_rows(standbys, "standby-verdicts") == sum(small.standbys.values())

    large = fleet.grow()
    at_large, outputs = counted(refresh)
    cards, standbys = outputs[4], outputs[6]
    assert len(cards) == len(small.nodes) + len(large.nodes)
    expected = sum(small.standbys.values()) + sum(large.standbys.values())
    assert table_rows(standbys, "standby-verdicts") == expected
    assert_flat("placement", at_small, at_large)


def test_recoveries_refresh_queries_do_not_grow_with_the_jobs_compared(fleet):
    small = fleet.small()
    chosen = small.jobs
    recoveries.refresh(1, [job.pk for job in chosen], 900, user=fleet.viewer)  # warm up
    at_small, (timelines, _, episodes, _, strategies) = counted(
        lambda: recoveries.refresh(1, [job.pk for job in chosen], 900, user=fleet.viewer)
    )
    assert len(timelines.layout.annotations) == len(chosen)  # one column title per job
    assert table_rows(episodes, "episodes") == sum(small.episodes[job.pk] for job in chosen)
    assert table_rows(strategies, "strategy-rows") == len({job.strategy for job in chosen})

    large = fleet.grow()
    chosen = large.jobs[: recoveries.MAX_COMPARED]
    at_large, (timelines, _, episodes, _, strategies) = counted(
        lambda: recoveries.refresh(1, [job.pk for job in chosen], 900, user=fleet.viewer)
    )
    assert [a.text.split(" · ")[0] for a in timelines.layout.annotations] == [
        job.name for job in chosen
    ]
    assert table_rows(episodes, "episodes") == sum(large.episodes[job.pk] for job in chosen)
    assert table_rows(strategies, "strategy-rows") == 4  # every strategy has recovered
    assert_flat("recoveries", at_small, at_large)


def test_resources_refresh_queries_do_not_grow_with_the_nodes(fleet):
    def refresh():
        return resources.refresh(1, 900, user=fleet.viewer)

    def lines(figure) -> set[str]:
        return {trace.name for trace in figure.data if len(trace.x)}

    small = fleet.small()
    refresh()  # warm up
    at_small, (figure, note) = counted(refresh)
    assert lines(figure) == {node.name for node in small.nodes}
    assert note.startswith(f"{len(small.nodes)} nodes;")

    large = fleet.grow()
    at_large, (figure, note) = counted(refresh)
    assert lines(figure) == {node.name for node in small.nodes + large.nodes}
    assert note.startswith(f"{len(small.nodes) + len(large.nodes)} nodes;")
    assert_flat("resources", at_small, at_large)
