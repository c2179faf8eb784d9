"""The API's lists at fleet size: filters, orderings and pages of /api/jobs/ (with the fleet's
totals beside each page), /api/fleet/, the fleet-wide /api/recoveries/, and the node, fault and
episode filters. Expected answers are computed here from the seeded rows in plain Python."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.fleet.seed import seed_fleet
from console.models import FaultInjection, Job, Node, RecoveryEpisode, Replica
from console.roles import VIEWER

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    return seed_fleet(jobs=40, nodes=10, minutes=0.5)


def every_page(api, url: str, limit: int = 7) -> list[dict]:
    """Every row of a list, read page by page through its `next` links."""
    rows, url = [], f"{url}{'&' if '?' in url else '?'}limit={limit}"
    while url:
        body = api.get(url).json()
        rows += body["results"]
        url = body["next"]
    return rows


def live_replicas():
    return Replica.objects.exclude(state__in=(Replica.State.STOPPED, Replica.State.FAILED))


def expected_totals() -> dict:
    jobs = list(Job.objects.all())
    statuses = Counter(job.status for job in jobs)
    nodes = Counter(Node.objects.values_list("state", flat=True))
    roles = Counter(live_replicas().values_list("role", flat=True))
    open_episodes = list(RecoveryEpisode.objects.filter(watched_s__isnull=True))
    return {
        "jobs": {
            "total": len(jobs),
            "live": sum(1 for job in jobs if job.is_live),
            "by_status": {status: statuses[status] for status, _ in Job.Status.choices},
        },
        "replicas": {
            "total": sum(roles.values()),
            "primary": roles["primary"],
            "standby": roles["standby"],
        },
        "nodes": {
            "total": sum(nodes.values()),
            "up": nodes["up"],
            "down": sum(nodes.values()) - nodes["up"],
            "by_state": {state: nodes[state] for state, _ in Node.State.choices},
        },
        "open_recoveries": len(open_episodes),
        "jobs_with_open_recoveries": len({e.job_id for e in open_episodes}),
    }


def test_the_job_list_keeps_its_shape_and_adds_the_fleet_totals(fleet, api_as):
    api = api_as(VIEWER)
    body = api.get("/api/jobs/?limit=5").json()
    assert set(body) == {"count", "next", "previous", "results", "totals"}
    assert body["count"] == 40 and len(body["results"]) == 5
    assert body["totals"] == expected_totals()
    assert api.get("/api/fleet/").json() == expected_totals()
    # The totals are the fleet's whatever the filter.
    assert api.get("/api/jobs/?status=failed").json()["totals"] == expected_totals()
    # Sanity of the seed: something in each bucket the console shows.
    totals = expected_totals()
    assert (
        totals["nodes"]["down"]
        and totals["open_recoveries"]
        and totals["jobs"]["by_status"]["failed"]
    )


def test_pages_cover_every_job_once_newest_first(fleet, api_as):
    rows = every_page(api_as(VIEWER), "/api/jobs/")
    expected = list(Job.objects.order_by("-created_at", "-id").values_list("pk", flat=True))
    assert [row["id"] for row in rows] == expected


@pytest.mark.parametrize(
    "query, keep",
    [
        ("status=running", lambda job, ctx: job.status == "running"),
        ("status=failed,stopped", lambda job, ctx: job.status in ("failed", "stopped")),
        ("status=failed&status=starting", lambda job, ctx: job.status in ("failed", "starting")),
        ("strategy=adaptive", lambda job, ctx: job.strategy == "adaptive"),
        ("topology=topn", lambda job, ctx: job.topology == "topn"),
        ("node=node-03", lambda job, ctx: job.pk in ctx["on_node_03"]),
        ("open_recovery=true", lambda job, ctx: job.pk in ctx["open"]),
        ("open_recovery=false", lambda job, ctx: job.pk not in ctx["open"]),
        ("search=ACTIVE-ALL", lambda job, ctx: "active-all" in job.name),
        (
            "status=running&strategy=active-all&topology=wordcount",
            lambda job, ctx: (
                (job.status, job.strategy, job.topology) == ("running", "active-all", "wordcount")
            ),
        ),
    ],
)
def test_job_filters_keep_exactly_the_matching_jobs(fleet, api_as, query, keep):
    on_node = live_replicas().filter(node__name="node-03")
    still_open = RecoveryEpisode.objects.filter(watched_s__isnull=True)
    context = {
        "on_node_03": set(on_node.values_list("job_id", flat=True)),
        "open": set(still_open.values_list("job_id", flat=True)),
    }
    rows = every_page(api_as(VIEWER), f"/api/jobs/?{query}")
    expected = {job.pk for job in Job.objects.all() if keep(job, context)}
    assert expected, "the seed has jobs of every kind"
    assert {row["id"] for row in rows} == expected
    assert len(rows) == len(expected)


def test_orderings(fleet, api_as):
    api = api_as(VIEWER)
    names = [row["name"] for row in every_page(api, "/api/jobs/?ordering=name")]
    assert names == sorted(names)
    oldest = [row["id"] for row in every_page(api, "/api/jobs/?ordering=oldest")]
    assert oldest == list(Job.objects.order_by("created_at", "id").values_list("pk", flat=True))
    statuses = [row["status"] for row in every_page(api, "/api/jobs/?ordering=status")]
    assert statuses == sorted(statuses)


@pytest.mark.parametrize(
    "query, field",
    [
        ("status=runing", "status"),
        ("strategy=fastest", "strategy"),
        ("ordering=-name", "ordering"),
        ("open_recovery=maybe", "open_recovery"),
        ("node=a%00b", "node"),
        ("search=" + "x" * 101, "search"),
        ("node=a&node=b", "node"),
    ],
)
def test_bad_filter_values_are_a_400_naming_the_parameter(fleet, api_as, query, field):
    response = api_as(VIEWER).get(f"/api/jobs/?{query}")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["detail"]


def test_fleet_wide_recoveries_and_their_filters(fleet, api_as):
    api = api_as(VIEWER)
    open_rows = every_page(api, "/api/recoveries/?open=true")
    assert {row["id"] for row in open_rows} == set(
        RecoveryEpisode.objects.filter(watched_s__isnull=True).values_list("pk", flat=True)
    )
    assert all(row["watched_s"] is None for row in open_rows)
    closed = every_page(api, "/api/recoveries/?open=false&action=promote")
    expected = RecoveryEpisode.objects.filter(watched_s__isnull=False, action="promote")
    assert {row["id"] for row in closed} == set(expected.values_list("pk", flat=True))
    job = open_rows[0]["job"]
    of_job = every_page(api, f"/api/recoveries/?job={job}")
    assert {row["job"] for row in of_job} == {job}
    assert every_page(api, f"/api/jobs/{job}/recoveries/?open=true") == [
        {k: v for k, v in row.items() if k != "job"} for row in of_job if row["watched_s"] is None
    ]
    assert api.get("/api/recoveries/?job=x").status_code == 400


def test_node_and_fault_filters(fleet, api_as):
    api = api_as(VIEWER)
    down = every_page(api, "/api/nodes/?state=down,unknown")
    assert {row["name"] for row in down} == set(
        Node.objects.exclude(state="up").values_list("name", flat=True)
    )
    newest_beat = every_page(api, "/api/nodes/?ordering=-last_heartbeat")
    beats = [row["last_heartbeat"] for row in newest_beat]
    assert beats == sorted(beats, reverse=True)
    assert [row["name"] for row in every_page(api, "/api/nodes/?search=NODE-0")] == [
        f"node-0{i}" for i in range(1, 10)
    ]
    fault = FaultInjection.objects.first()
    rows = every_page(api, f"/api/jobs/{fault.job_id}/faults/?kind=kill-driver&outcome=injected")
    assert [row["id"] for row in rows] == [fault.pk]
    assert every_page(api, f"/api/jobs/{fault.job_id}/faults/?outcome=pending") == []
