"""The console in a real browser (the system Chromium through Playwright).

An operator logs in through the login form, watches live numbers change, injects a fault by
clicking (with the confirm step) and sees the recovery episode appear; a viewer sees no controls.
Screenshots of every page go to docs/screenshots/.

The operator test watches a real job: the `cluster` fixture runs the Celery controller, beat and
three node agents, which run the job's Spark stages; the fault clicked in the browser is injected
by the real controller, and the episode is the one the supervision code records. The viewer test
needs no running job and uses seeded rows.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil
import pytest
from django.db import connections

from console.models import FaultInjection, Job, MetricSample, Team
from console.roles import ADMIN, OPERATOR, VIEWER
from console.services.faults import request_fault
from console.services.jobs import create_job, stop_job
from console.services.policy import change_policy
from console.services.teams import DEFAULT_TEAM
from infra.launcher import wait_for
from spark_runtime.cpu_priority import autogroup_nice, set_autogroup_nice, set_session_nice
from spark_runtime.strategies import CONSOLE_NICE
from tests.dash.seed import seed_console
from tests.factories import UserFactory, make_job
from tests.integration.live import wait_for_caught_up_standby

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
PASSWORD = "browser-test-pw-1"
# Dash loads its bundles on the first visit; after that a refresh lands every 2 s.
LOAD_MS = 20_000
# Metrics are stored every policy cycle (5 s) and pages refresh every 2 s.
REFRESHES_MS = 20_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs the system Chromium at /usr/bin/chromium"
    ),
]


class LiveJob:
    """A real adaptive wordcount job run by the `cluster` fixture's controller and node agents.

    Its numbers arrive on their own (the controller stores metrics every cycle) and the episode a
    fault causes is recorded by the supervision code, so `tick()` and `react_to()` only wait.
    """

    def __init__(self, job):
        self.job = job

    def tick(self) -> None:
        """New samples land every policy cycle (5 s); nothing to do but let one pass."""

    def react_to(self, fault: FaultInjection) -> None:
        """The controller injects the fault and records the episode itself."""


@pytest.fixture
def console_priority(browser):
    """This test process is the console's web server (live_server): give it the CPU priority
    the demo gives its web server (strategies.CONSOLE_NICE) while the cluster's processes run
    at theirs, and Chromium too, which stands for a browser on the operator's own machine (it
    runs in a session of its own). Set on the sessions' autogroups, which is what counts between
    sessions; this session's level before is put back. A test run started by a service (CI) may
    sit in init's root group, which has no autogroup level: there each of this process's
    threads (the live server's, whose request threads inherit it) gets the level instead."""
    for process in psutil.Process().children(recursive=True):
        if "chrom" in process.name() and os.getsid(process.pid) == process.pid:
            set_session_nice(process.pid, CONSOLE_NICE)
    before = autogroup_nice()
    if before is not None:
        set_autogroup_nice(CONSOLE_NICE)
        yield
        set_autogroup_nice(before)
        return
    threads = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in _thread_ids()}
    for tid in threads:
        _set_thread_nice(tid, CONSOLE_NICE)
    yield
    for tid, level in threads.items():
        _set_thread_nice(tid, level)


def _thread_ids() -> list[int]:
    return (
        [int(tid) for tid in os.listdir("/proc/self/task")]
        if os.path.isdir("/proc/self/task")
        else []
    )


def _set_thread_nice(tid: int, level: int) -> None:
    """On Linux a nice level is a thread's (setpriority(2) with a thread id); a thread that
    has ended since, or a level this process may not take, leaves it as it was."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.setpriority(os.PRIO_PROCESS, tid, level)


@pytest.fixture
def live_job(cluster, console_users, console_priority):
    """A running job with real throughput samples, launched like an operator would."""
    job = create_job(
        name="wc-live",
        topology="wordcount",
        strategy="adaptive",
        params={"rate": 60},
        user=console_users[OPERATOR],
        team=Team.named(DEFAULT_TEAM),
    )
    wait_for(lambda: Job.objects.get(pk=job.pk).status == "running", 180, "the job to run")
    wait_for(
        lambda: MetricSample.objects.filter(job=job, stage="", name="throughput_eps").exists(),
        60,
        "throughput samples",
    )
    return LiveJob(Job.objects.get(pk=job.pk))


@pytest.fixture
def seeded_job(transactional_db):
    """A job with seeded history, for checks that need no running job."""
    return seed_console().adaptive


@pytest.fixture
def console_users(transactional_db):
    """An operator and a viewer who log in with PASSWORD."""
    return {
        OPERATOR: UserFactory(username="olga", role=OPERATOR, password=PASSWORD),
        VIEWER: UserFactory(username="victor", role=VIEWER, password=PASSWORD),
    }


@pytest.fixture
def browser(monkeypatch):
    """The system Chromium; Playwright's own browser downloads are never used."""
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop on this thread; the ORM calls the test makes in
    # between are still plain synchronous calls.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    # Assertions wait as long as page loads may take (the first visit loads Dash's bundles).
    sync_api.expect.set_options(timeout=LOAD_MS)
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
        # ORM calls made while Playwright runs use their own connection (Django keys connections
        # by context, and Playwright's loop makes one); close it or PostgreSQL cannot drop the
        # test database at the end of the session.
        connections.close_all()


def _log_in(browser, base_url: str, username: str):
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.set_default_timeout(LOAD_MS)
    page.goto(f"{base_url}/accounts/login/?next=/console/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base_url}/console/")
    return page


def _shoot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_timeout(1500)  # let plotly finish drawing after the data arrived
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_operator_watches_live_numbers_injects_a_fault_and_sees_the_episode(
    live_server, browser, live_job, console_users
):
    from playwright.sync_api import expect

    job = live_job.job
    page = _log_in(browser, live_server.url, "olga")

    # Overview: the job's throughput is shown and changes while the page stays open.
    throughput = page.locator("#jobs tr", has_text=job.name).locator("td").nth(4)
    expect(throughput).not_to_have_text("—")
    before = throughput.inner_text()
    live_job.tick()
    expect(throughput).not_to_have_text(before, timeout=REFRESHES_MS)
    expect(page.locator("#start-button")).to_be_visible()
    _shoot(page, "overview")

    # Job page: choose an operator, click inject, confirm; the fault is recorded for this user.
    # Only once count's standby has caught up: the first standby replays the input from the
    # start, and a fault before it is promotable restarts the primary instead (a race between
    # the restart and the catch-up decides the episode's action).
    wait_for_caught_up_standby(job, "count")
    page.goto(f"{live_server.url}/console/jobs/{job.pk}/")
    expect(page.locator("#operators")).to_be_visible()
    page.click("#fault-operator")
    page.locator("#fault-operator").get_by_text("count", exact=True).click()
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#fault-button")
    expect(page.locator("#fault-result")).to_contain_text("requested")
    fault = FaultInjection.objects.get(job=job, target_operator="count")
    assert fault.requested_by == console_users[OPERATOR]
    assert fault.kind == FaultInjection.Kind.KILL_DRIVER
    expect(page.locator("#faults")).to_contain_text("count")
    _shoot(page, "job")

    # Recoveries: the episode the fault caused shows up within a few refreshes.
    page.goto(f"{live_server.url}/console/recoveries/")
    episodes = page.locator("#episodes")
    expect(episodes).to_be_visible()
    live_job.react_to(fault)
    # The standby of the stateful count stage takes over.
    expect(episodes).to_contain_text("kill-driver on count", timeout=REFRESHES_MS)
    expect(episodes).to_contain_text("promote", timeout=REFRESHES_MS)
    _shoot(page, "recoveries")

    page.goto(f"{live_server.url}/console/placement/")
    expect(page.locator("#node-node-1")).to_be_visible()
    _shoot(page, "placement")

    page.goto(f"{live_server.url}/console/resources/")
    expect(page.locator("#resources-note")).to_contain_text("nodes")
    _shoot(page, "resources")


def test_viewer_sees_numbers_but_no_controls(live_server, browser, seeded_job, console_users):
    page = _log_in(browser, live_server.url, "victor")
    controls = "#controls *, #start-button, #stop-button, #fault-button, #threshold-button"
    for path, ready in (
        ("/console/", "#jobs"),
        (f"/console/jobs/{seeded_job.pk}/", "#operators"),
        ("/console/placement/", "#node-node-a"),
    ):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_selector(ready)
        # Controls arrive with the first callbacks; give them a refresh to show up if they would.
        page.wait_for_timeout(2500)
        assert page.locator(controls).count() == 0, path


def test_the_recovery_timeline_shows_a_phase_bar_per_episode(
    live_server, browser, seeded_job, console_users
):
    from playwright.sync_api import expect

    page = _log_in(browser, live_server.url, "victor")
    page.goto(f"{live_server.url}/console/recoveries/")
    phases = page.locator("#phases")
    # The seeded promotion and restart-job episodes, each split into its phases.
    for text in ("Phases of each recovery", "detection", "state restore", "first output"):
        expect(phases).to_contain_text(text)
    assert page.locator("#phases .bars .point").count() >= 2 * 5
    _shoot(page, "recovery-phases")


def test_pages_run_under_the_csp_and_send_the_csrf_token(
    live_server, browser, seeded_job, console_users
):
    """Every console page renders and refreshes with the Content-Security-Policy and the CSRF
    check on the Dash endpoint: no CSP violation, no refused callback."""
    page = _log_in(browser, live_server.url, "victor")
    problems = []
    page.on(
        "console",
        lambda message: (
            problems.append(message.text)
            if "Content Security Policy" in message.text or "403" in message.text
            else None
        ),
    )
    updates = []
    page.on(
        "response",
        lambda response: (
            updates.append(response.status) if "_dash-update-component" in response.url else None
        ),
    )
    for path, ready in (
        ("/console/", "#jobs"),
        (f"/console/jobs/{seeded_job.pk}/", "#operators"),
        ("/console/placement/", "#node-node-a"),
        ("/console/recoveries/", ".js-plotly-plot"),
        ("/console/resources/", ".js-plotly-plot"),
    ):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_selector(ready)
        page.wait_for_timeout(2500)  # at least one refresh callback
    assert problems == []
    assert updates and all(status in (200, 204) for status in updates), updates


def test_an_admin_searches_the_audit_log(live_server, browser, console_users):
    """The audit page lists writes newest first and narrows them by action; shot for the docs."""
    admin = UserFactory(username="ada", role=ADMIN, password=PASSWORD)
    operator = console_users[OPERATOR]
    job = make_job(Job.Status.RUNNING, name="clicks")
    change_policy({"priority_threshold": 0.45}, user=admin, reason="fewer standbys at night")
    request_fault(job, "kill-driver", target_operator="count", requested_by=operator)
    stop_job(job, "maintenance window", user=operator)
    page = _log_in(browser, live_server.url, "ada")
    page.goto(f"{live_server.url}/console/audit/")
    rows = page.locator("#audit-events tbody tr")
    # The sign-in just made is the newest event.
    assert rows.first.inner_text().split("\t")[1:3] == ["ada", "login"]
    page.select_option("select[name=action]", "fault.inject")
    page.click("form.audit-filters button[type=submit]")
    page.wait_for_url("**action=fault.inject**")
    assert rows.count() == 1 and "otto" not in rows.first.inner_text()
    assert "olga" in rows.first.inner_text()
    page.goto(f"{live_server.url}/console/audit/")
    _shoot(page, "audit")
