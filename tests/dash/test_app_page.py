"""A running app (jobs/apps/spend_totals.py, two queries) on the real controller and node
agents: its queries with real figures, its stateful operator found in the query's plan and
scored by the policy, and its output appear through GET /api/jobs/{id}/, then on the job page
in the system Chromium (screenshot docs/screenshots/job-app.png)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from console.models import Job, Operator
from console.roles import ADMIN, OPERATOR
from infra.launcher import wait_for
from tests.app_files import purchases, write_input
from tests.conftest import wait_until
from tests.dash import test_browser
from tests.dash.test_browser import CHROMIUM, _log_in, _shoot
from tests.factories import UserFactory
from tests.integration.live import api

pytestmark = [
    pytest.mark.spark,
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the system Chromium"),
]

APPS = Path(__file__).resolve().parents[2] / "jobs" / "apps"
browser = test_browser.browser
console_users = test_browser.console_users
# The app's first line: what its output tail must show.
GREETING = "spend totals: starting its queries"


@pytest.fixture(autouse=True)
def jobs_dir(tmp_path, monkeypatch):
    """A jobs directory with the spend app, printing a line first; set before the cluster."""
    directory = tmp_path / "jobs"
    shutil.copytree(APPS, directory / "apps")
    app = directory / "apps" / "spend_totals.py"
    app.write_text(f'print("{GREETING}", flush=True)\n' + app.read_text())
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    return directory


def app_of(job: Job) -> dict:
    response = api().get(f"/api/jobs/{job.pk}/")
    assert response.status_code == 200, response.content
    return response.json()["app"]


def test_a_running_apps_queries_operators_and_output(
    cluster, live_server, browser, console_users, tmp_path
):
    from playwright.sync_api import expect

    UserFactory(username="opal", role=OPERATOR)
    admin = APIClient()
    admin.force_authenticate(UserFactory(username="adam", role=ADMIN))
    registered = admin.post(
        "/api/topologies/", {"app": "apps/spend_totals.py", "name": "spend"}, format="json"
    )
    assert registered.status_code == 201, registered.content
    source, out = tmp_path / "in", tmp_path / "out"
    written = []
    for file in range(3):
        write_input(source, file, purchases(file))
        written += purchases(file)
    response = api().post(
        "/api/jobs/",
        {"name": "spend-page", "topology": "spend@1", "strategy": "restart-all",
         "args": ["--in", str(source), "--out", str(out), "--large", "70"]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])

    def both_queries_ran():
        queries = {q["query"]: q for q in app_of(job)["queries"]}
        return queries if set(queries) == {"totals", "large"} else None

    def state() -> str:
        fresh = Job.objects.get(pk=job.pk)
        replicas = list(fresh.replicas.values_list("replica_id", "state"))
        return f"both queries' first batches: job {fresh.status} {replicas} {app_of(job)}"

    # Long: the cluster and the app's session start on 2 shared cores (425 s of setup seen).
    wait_until(both_queries_ran, 480, state, poll_s=2)
    for file in range(3, 6):
        write_input(source, file, purchases(file))
        written += purchases(file)
    users = {row["user"] for row in written}

    def totals_caught_up():
        totals = both_queries_ran()["totals"]
        # The new files are read in a later batch than the first (every user is in both).
        return totals if totals["batch"] >= 1 and totals["state_rows"] == len(users) else None

    # The aggregation keeps one state row per user: the figure computed independently.
    totals = wait_until(totals_caught_up, 180, "every user in the totals query's state", poll_s=1)
    assert totals["batch_ms"] > 0 and totals["input_rows"] > 0
    assert totals["sources"] and "FileStreamSource" in totals["sources"][0]["source"]
    assert [op["name"] for op in totals["operators"]] == ["totals:aggregate"]
    large = both_queries_ran()["large"]
    assert large["operators"] == [] and large["state_rows"] == 0  # stateless: no state
    # The found operator is the job's, scored by a policy cycle (S of an aggregation).
    found = wait_until(
        lambda: Operator.objects.filter(job=job, name="totals:aggregate", priority__gt=0).first(),
        60,
        "the found operator scored",
    )
    assert found.type_score == 0.5 and found.upstream == ["app"]
    assert GREETING in [line["line"] for line in app_of(job)["output"]]

    page = _log_in(browser, live_server.url, "olga")
    page.goto(f"{live_server.url}/console/jobs/{job.pk}/")
    expect(page.locator("#app-queries-table")).to_contain_text("totals:aggregate (aggregate)")
    expect(page.locator("#app-queries-table")).to_contain_text("large")
    expect(page.locator("#app-output-text")).to_contain_text(GREETING)
    expect(page.locator("#operators-table")).to_contain_text("totals:aggregate")
    _shoot(page, "job-app")

    stopped = api().post(f"/api/jobs/{job.pk}/stop/")
    assert stopped.status_code == 200, stopped.content
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.STOPPED, 90, "job stopped")
