"""The console pages at fleet size: the overview's filtered, sorted, paged job list and fleet
totals; the placement page's heatmap, upright Q bars and node filters; the resources page's
band of every node with the busiest or chosen ones drawn. Callbacks are called directly."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from dash import html

from bench.fleet.seed import seed_fleet
from console.dash.overview import callbacks as overview
from console.dash.overview.layout import PAGE_SIZE
from console.dash.placement import callbacks as placement
from console.dash.resources import callbacks as resources
from console.models import Job, Node, RecoveryEpisode
from console.roles import VIEWER
from tests.dash.components import text_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    return seed_fleet(jobs=60, nodes=50, minutes=1)


def job_names(table) -> list[str]:
    """The job names in the overview's job table (the first cell's link of each row)."""
    rows = []

    def walk(component):
        if isinstance(component, list | tuple):
            for child in component:
                walk(child)
        elif isinstance(component, html.Tr):
            cells = component.children
            if cells and isinstance(cells[0], html.Td) and isinstance(cells[0].children, html.A):
                rows.append(cells[0].children.children)
        elif component is not None and not isinstance(component, str | int | float):
            walk(getattr(component, "children", None))

    walk(table)
    return rows


def test_overview_pages_through_the_jobs_and_shows_fleet_totals(fleet, users):
    viewer = users[VIEWER]
    kpis, jobs, *_ = overview.refresh(1, 900, user=viewer)
    newest = list(Job.objects.order_by("-created_at", "-id").values_list("name", flat=True))
    assert job_names(jobs) == newest[:PAGE_SIZE]
    assert "60 jobs; showing 1-25 (page 1 of 3)" in text_of(jobs)
    text = text_of(kpis)
    running = Job.objects.filter(status="running").count()
    assert f"{running} running jobs" in text
    assert "48/50" in text and "2 not up" in text
    opened = RecoveryEpisode.objects.filter(watched_s__isnull=True).count()
    assert f"{opened} open episodes" in text
    _, last, *_ = overview.refresh(1, 900, page=3, user=viewer)
    assert job_names(last) == newest[2 * PAGE_SIZE :]
    # A page past the end shows the last one.
    _, beyond, *_ = overview.refresh(1, 900, page=99, user=viewer)
    assert job_names(beyond) == newest[2 * PAGE_SIZE :]


def test_overview_filters_and_sorts(fleet, users):
    viewer = users[VIEWER]
    _, jobs, *_ = overview.refresh(
        1, 900, None, ["failed", "stopped"], None, None, None, None, "name", 1, user=viewer
    )
    expected = sorted(
        Job.objects.filter(status__in=["failed", "stopped"]).values_list("name", flat=True)
    )
    assert job_names(jobs) == expected
    assert f"{len(expected)} of 60 jobs match" in text_of(jobs)
    _, jobs, *_ = overview.refresh(
        1, 900, "topn", None, ["active-all"], None, None, ["open"], "newest", 1, user=viewer
    )
    open_jobs = RecoveryEpisode.objects.filter(watched_s__isnull=True).values_list(
        "job_id", flat=True
    )
    expected = list(
        Job.objects.filter(name__contains="topn"[:2], strategy="active-all", pk__in=open_jobs)
        .filter(name__icontains="topn")
        .values_list("name", flat=True)
    )
    assert job_names(jobs) == expected


def test_overview_filter_inputs_that_are_forged_filter_nothing_and_break_nothing(fleet, users):
    outputs = overview.refresh(
        1, 900, {"x": 1}, [["running"]], 5, [None, 3], ["node-01"], {"open": 1}, ["name"], "2",
        user=users[VIEWER],
    )  # fmt: skip
    assert "60 jobs; showing 1-25 (page 1 of 3)" in text_of(outputs[1])


def test_the_pager_turns_within_the_pages_and_a_filter_starts_again(fleet, users):
    viewer = users[VIEWER]
    filters = [None, None, None, None, None, None, "newest"]

    def turn(prop, page):
        context = SimpleNamespace(triggered=[{"prop_id": prop, "value": 1}])
        return overview.turn_page(1, 1, *filters, page, user=viewer, callback_context=context)

    assert turn("jobs-next.n_clicks", 1) == 2
    assert turn("jobs-next.n_clicks", 3) == 3  # 60 jobs: three pages
    assert turn("jobs-prev.n_clicks", 1) == 1
    assert turn("jobs-prev.n_clicks", 3) == 2
    assert turn("job-status.value", 3) == 1


def test_placement_at_fleet_size_draws_a_heatmap_and_filters_the_node_cards(fleet, users):
    viewer = users[VIEWER]
    summary, idle, q, _, cards, shown, standbys, *_ = placement.refresh(1, user=viewer)
    assert idle.data[0].type == "heatmap"
    assert len(idle.data[0].x) == 51 and idle.data[0].x[-1] == "cluster"
    assert q.data[0].orientation in (None, "v") and len(q.data[0].x) == 50
    assert len(cards) == 50 and shown == "50 of 50 nodes shown, in queue order by Q"
    _, _, _, _, cards, shown, *_ = placement.refresh(1, "not-up", None, user=viewer)
    down = set(Node.objects.exclude(state="up").values_list("name", flat=True))
    assert {card.id.removeprefix("node-") for card in cards} == down
    _, _, _, _, cards, _, standbys, *_ = placement.refresh(1, "all", "active-all-003", user=viewer)
    job = Job.objects.get(name="wo-active-all-003")
    assert {card.id.removeprefix("node-") for card in cards} == set(
        job.replicas.values_list("node__name", flat=True)
    )
    assert "wo-active-all-003" in text_of(standbys)
    assert "wo-adaptive-000" not in text_of(standbys)


def test_a_long_list_of_replicas_folds_into_more(users):
    replicas = [
        {"job_id": i, "job": f"job-{i}", "stage": "count", "state": "running",
         "replica_id": f"r{i}", "nice": None, "batch_every_s": None}
        for i in range(11)
    ]  # fmt: skip
    chips = placement._chips(replicas, "primary")
    assert len(chips) == placement.CHIPS_SHOWN + 1
    assert "+3 more" in text_of(chips[-1])


def test_resources_at_fleet_size_draw_the_band_and_the_busiest_or_chosen_nodes(fleet, users):
    viewer = users[VIEWER]
    figure, note = resources.refresh(1, 900, user=viewer)
    lines = {t.name for t in figure.data if t.legendgroup != "fleet"}
    means = {
        node.name: sum(s.value for s in samples) / len(samples)
        for node in Node.objects.all()
        if (samples := list(node.metrics.filter(name="cpu_util")))
    }
    assert lines == set(sorted(means, key=means.get, reverse=True)[: resources.BUSIEST])
    assert "50 nodes" in note and "busiest" in note and "band" in note
    assert any(t.fill == "tonexty" for t in figure.data)
    chosen = list(Node.objects.order_by("name").values_list("pk", flat=True)[:2])
    figure, note = resources.refresh(1, 900, chosen + [True, "x", 10**9], user=viewer)
    assert {t.name for t in figure.data if t.legendgroup != "fleet"} == {
        "node-01",
        "node-02",
    }
    assert "the 2 chosen" in note


def test_the_pager_through_the_dash_endpoint(fleet, users, client):
    """django-plotly-dash hands the callback which button was clicked (callback_context)."""
    client.force_login(users[VIEWER])
    filters = [
        ("job-search", "value", None), ("job-status", "value", None),
        ("job-strategy", "value", None), ("job-topology", "value", None),
        ("job-node", "value", None), ("job-open", "value", []), ("job-sort", "value", "newest"),
    ]  # fmt: skip

    def turn(button, page):
        body = {
            "output": "jobs-page.data",
            "outputs": {"id": "jobs-page", "property": "data"},
            "inputs": [
                {"id": "jobs-prev", "property": "n_clicks", "value": 1},
                {"id": "jobs-next", "property": "n_clicks", "value": 1},
                *({"id": i, "property": p, "value": v} for i, p, v in filters),
            ],
            "state": [{"id": "jobs-page", "property": "data", "value": page}],
            "changedPropIds": [f"{button}.n_clicks"],
        }
        response = client.post(
            "/django_plotly_dash/app/backstop-overview/_dash-update-component",
            json.dumps(body),
            content_type="application/json",
        )
        assert response.status_code == 200, response.content
        return response.json()["response"]["jobs-page"]["data"]

    assert turn("jobs-next", 1) == 2
    assert turn("jobs-next", 3) == 3
    assert turn("jobs-prev", 2) == 1
