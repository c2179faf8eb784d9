"""The alerting page: the callback's tables and figure from real rows, only for operators, and
the page in the system Chromium (its screenshot goes to docs/screenshots/alerts.png)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from dash.exceptions import PreventUpdate
from django.utils import timezone

from bench.receivers import Receiver, free_port
from console.dash.alerting import callbacks
from console.models import AlertDelivery, AlertRoute, Job, Team
from console.roles import OPERATOR, VIEWER
from console.services.alert_routing import clear_alert, deliver, raise_alert
from tests.dash.test_browser import CHROMIUM, _log_in, _shoot, browser  # noqa: F401 (fixture)
from tests.factories import UserFactory, make_job

PASSWORD = "browser-test-pw-1"


def seed_alerts(monkeypatch) -> None:
    """Three routes; a delivered trigger and resolve, one failing against a receiver that is
    down, one pending."""
    monkeypatch.setattr("console.services.alert_routing.enqueue", lambda ids: None)
    payments = Team.named("payments")
    job = make_job(Job.Status.RUNNING, name="payments-wc")
    Job.objects.filter(pk=job.pk).update(team=payments)
    job.refresh_from_db()
    down = f"http://127.0.0.1:{free_port()}/hook"
    with Receiver(status=202) as pagerduty:
        AlertRoute.objects.create(
            name="payments-pagerduty", channel="pagerduty", target=pagerduty.url,
            secret="R0UT1NGKEY", min_severity="error",
        ).teams.add(payments)  # fmt: skip
        AlertRoute.objects.create(
            name="sre-webhook", channel="webhook", target=down, secret="k", min_severity="info"
        )
        AlertRoute.objects.create(
            name="ops-slack", channel="slack", target="https://hooks.slack.com/services/T/B/X",
            events=["kafka-lag"], enabled=False,
        )  # fmt: skip
        key = f"job-unprotected:{job.key}:count"
        raise_alert(key, "job-unprotected", job=job, summary="payments-wc: count unprotected 130 s")
        now = timezone.now()
        for delivery in AlertDelivery.objects.all():
            deliver(delivery.pk, now=now)
        raise_alert(f"job-failed:{job.key}", "job-failed", job=job, summary="payments-wc failed")
        clear_alert(key, now=now + timedelta(seconds=1))
        pending = AlertDelivery.objects.filter(route__name="payments-pagerduty", status="pending")
        for delivery in pending.order_by("pk"):
            deliver(delivery.pk, now=now + timedelta(seconds=2))
        pagerduty.wait_for(3)


@pytest.mark.django_db
def test_the_refresh_lists_routes_and_deliveries_with_status_attempts_and_errors(
    monkeypatch,
):
    seed_alerts(monkeypatch)
    operator = UserFactory(username="olga", role=OPERATOR, team="payments")
    alerts, routes, figure, deliveries = callbacks.refresh(1, "", user=operator)
    assert "payments-wc failed" in str(alerts)
    assert "count unprotected" not in str(alerts)  # resolved
    text = str(routes) + str(deliveries)
    assert "payments-pagerduty" in text and "every event" in text and "payments" in text
    assert "(HTTP 202)" in text and "next try" in text
    assert "Connection refused" in text  # the webhook's receiver is down
    bars = {trace.name: list(trace.y) for trace in figure.data}
    assert list(figure.data[0].x) == ["payments-pagerduty", "sre-webhook"]
    # The webhook: both triggers, and the resolve that waits for its trigger.
    assert bars["delivered"] == [3, 0] and bars["pending"] == [0, 3]
    _, _, _, failed_only = callbacks.refresh(2, "failed", user=operator)
    assert "No deliveries." in str(failed_only)
    with pytest.raises(PreventUpdate):
        callbacks.refresh(1, "", user=UserFactory(username="vera", role=VIEWER))


@pytest.mark.django_db
def test_viewers_are_refused_the_page(client):
    client.force_login(UserFactory(username="vera", role=VIEWER))
    assert client.get("/console/alerts/").status_code == 403


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs the system Chromium")
def test_the_page_in_a_browser(live_server, browser, transactional_db, monkeypatch):  # noqa: F811
    from playwright.sync_api import expect

    seed_alerts(monkeypatch)
    UserFactory(username="olga", role=OPERATOR, password=PASSWORD, team="payments")
    page = _log_in(browser, live_server.url, "olga")
    expect(page.locator("nav a", has_text="Alerts")).to_be_visible()
    page.goto(f"{live_server.url}/console/alerts/")
    expect(page.locator("#open-alerts")).to_contain_text("payments-wc failed")
    expect(page.locator("#routes")).to_contain_text("payments-pagerduty")
    expect(page.locator("#deliveries")).to_contain_text("(HTTP 202)")
    expect(page.locator("#deliveries")).to_contain_text("Connection refused")
    page.wait_for_selector("#deliveries-chart .main-svg")
    _shoot(page, "alerts")
