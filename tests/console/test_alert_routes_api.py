"""The alert routes' API and admin: admins write (audited), operators read, invalid input is a
400 naming the field; deliveries are listed with their status and attempts."""

from __future__ import annotations

import pytest
from django.test import Client

from bench.receivers import Receiver
from console.models import AlertDelivery, AlertRoute, AuditEvent, Job, Team
from console.roles import ADMIN, OPERATOR, VIEWER
from console.services.alert_routing import clear_alert, deliver, raise_alert
from tests.factories import make_job

pytestmark = pytest.mark.django_db

WEBHOOK = {
    "name": "payments-oncall",
    "channel": "webhook",
    "target": "https://hooks.example.com/backstop",
    "events": ["job-failed", "kafka-lag"],
    "min_severity": "warning",
    "teams": ["payments"],
}


def test_an_admin_creates_a_route_and_the_audit_log_has_it(api_as):
    Team.named("payments")
    answer = api_as(ADMIN).post("/api/alert-routes/", WEBHOOK, format="json")
    assert answer.status_code == 201, answer.json()
    body = answer.json()
    assert {k: body[k] for k in WEBHOOK} == WEBHOOK
    assert len(body["secret"]) == 32  # generated, shown this once
    route = AlertRoute.objects.get()
    assert route.secret == body["secret"]
    event = AuditEvent.objects.get(action="route.create")
    assert event.target == f"route:{route.pk}" and event.actor_name == "ada"
    assert event.detail["teams"] == ["payments"] and "secret" not in event.detail
    listed = api_as(ADMIN).get("/api/alert-routes/").json()["results"]
    assert [r["name"] for r in listed] == ["payments-oncall"] and "secret" not in listed[0]
    # An operator of another team (the default one) does not see a route naming payments.
    assert api_as(OPERATOR).get("/api/alert-routes/").json()["results"] == []


def test_only_admins_write_routes_and_viewers_do_not_read_them(api_as):
    Team.named("payments")
    assert api_as(OPERATOR).post("/api/alert-routes/", WEBHOOK, format="json").status_code == 403
    assert api_as(VIEWER).get("/api/alert-routes/").status_code == 403
    assert api_as(VIEWER).get("/api/alert-deliveries/").status_code == 403
    assert not AlertRoute.objects.exists()


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"channel": "sms"}, "channel", "not a valid choice"),
        ({"target": "not a url"}, "target", "needs an http(s) URL"),
        ({"channel": "slack", "target": "ftp://x.example/"}, "target", "needs an http(s) URL"),
        ({"channel": "email", "target": "ops@"}, "target", "not a valid email address"),
        ({"events": ["job-exploded"]}, "events", "not a valid choice"),
        ({"min_severity": "meh"}, "min_severity", "not a valid choice"),
        ({"teams": ["nobody-team"]}, "teams", "does not exist"),
    ],
)
def test_invalid_routes_are_refused_naming_the_field(api_as, change, field, words):
    Team.named("payments")
    answer = api_as(ADMIN).post("/api/alert-routes/", {**WEBHOOK, **change}, format="json")
    assert answer.status_code == 400
    detail = answer.json()["error"]["detail"]
    assert set(detail) == {field}
    assert words in str(detail[field])
    assert not AuditEvent.objects.filter(action="route.create").exists()


def test_changes_and_deletes_are_audited_with_what_changed(api_as):
    Team.named("payments")
    admin = api_as(ADMIN)
    route_id = admin.post("/api/alert-routes/", WEBHOOK, format="json").json()["id"]
    answer = admin.patch(
        f"/api/alert-routes/{route_id}/", {"min_severity": "error", "secret": "new"}, format="json"
    )
    assert answer.status_code == 200, answer.json()
    change = AuditEvent.objects.get(action="route.change")
    assert change.detail == {"min_severity": ["warning", "error"], "secret": "changed"}
    assert AlertRoute.objects.get().secret == "new"
    assert admin.delete(f"/api/alert-routes/{route_id}/").status_code == 204
    deleted = AuditEvent.objects.get(action="route.delete")
    assert deleted.target == f"route:{route_id}" and deleted.detail["name"] == "payments-oncall"


def test_email_and_pagerduty_routes_are_accepted(api_as):
    admin = api_as(ADMIN)
    email = {"name": "mail", "channel": "email", "target": "a@example.com, b@example.com"}
    assert admin.post("/api/alert-routes/", email, format="json").status_code == 201
    pagerduty = {
        "name": "pd",
        "channel": "pagerduty",
        "target": "https://events.pagerduty.com/v2/enqueue",
        "secret": "R0UT1NGKEY",
        "min_severity": "error",
    }
    assert admin.post("/api/alert-routes/", pagerduty, format="json").status_code == 201
    assert AlertRoute.objects.get(name="pd").secret == "R0UT1NGKEY"
    assert AlertRoute.objects.get(name="mail").events == []  # empty: every event


def test_deliveries_are_listed_with_status_attempts_key_and_event(api_as):
    job = make_job(status=Job.Status.RUNNING)
    with Receiver() as receiver:
        AlertRoute.objects.create(name="hook", channel="webhook", target=receiver.url, secret="k")
        alert = raise_alert(f"job-failed:{job.pk}", "job-failed", job=job, summary="wc failed")
        deliver(AlertDelivery.objects.get().pk)
        receiver.wait_for(1)
    rows = api_as(OPERATOR).get("/api/alert-deliveries/").json()["results"]
    assert len(rows) == 1
    row = rows[0]
    assert (row["alert_key"], row["event"], row["status"], row["attempts"]) == (
        alert.key,
        "job-failed",
        "delivered",
        1,
    )
    assert (row["route"], row["channel"], row["action"], row["job"]) == (
        "hook",
        "webhook",
        "trigger",
        job.pk,
    )
    assert api_as(ADMIN).get("/api/alert-deliveries/?status=failed").json()["results"] == []


def test_the_admin_writes_routes_through_the_audit_log(users):
    payments = Team.named("payments")
    browser = Client()
    browser.force_login(users[ADMIN])
    users[ADMIN].is_staff = True
    users[ADMIN].save()
    form = {
        "name": "from-admin",
        "enabled": "on",
        "channel": "slack",
        "target": "https://hooks.slack.com/services/T/B/X",
        "events": '["job-failed"]',
        "min_severity": "error",
        "teams": [payments.pk],
        "secret": "",
    }
    answer = browser.post("/admin/console/alertroute/add/", form)
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    route = AlertRoute.objects.get()
    assert route.secret  # generated
    created = AuditEvent.objects.get(action="route.create")
    assert created.detail["teams"] == ["payments"] and created.actor_name == "ada"
    refused = browser.post(
        "/admin/console/alertroute/add/", {**form, "name": "bad", "target": "nope"}
    )
    assert refused.status_code == 200 and "needs an http(s) URL" in refused.content.decode()
    browser.post(f"/admin/console/alertroute/{route.pk}/change/", {**form, "enabled": ""})
    assert AuditEvent.objects.get(action="route.change").detail == {"enabled": [True, False]}


def test_the_admin_lists_alerts_and_deliveries_read_only(users, monkeypatch):
    monkeypatch.setattr("console.services.alert_routing.enqueue", lambda ids: None)
    job = make_job(status=Job.Status.RUNNING)
    AlertRoute.objects.create(name="hook", channel="webhook", target="http://127.0.0.1:9/")
    raise_alert(f"job-failed:{job.pk}", "job-failed", job=job, summary="wc failed")
    users[OPERATOR].is_staff = True
    users[OPERATOR].save()
    browser = Client()
    browser.force_login(users[OPERATOR])
    for page in ("alert", "alertdelivery"):
        listing = browser.get(f"/admin/console/{page}/")
        assert listing.status_code == 200 and "job-failed:" in listing.content.decode()
        assert browser.get(f"/admin/console/{page}/add/").status_code == 403
    assert browser.get("/admin/console/alertroute/add/").status_code == 403  # admins only


def test_metrics_count_open_alerts_and_deliveries_by_status(monkeypatch, settings, client):
    monkeypatch.setattr("console.services.alert_routing.enqueue", lambda ids: None)
    settings.METRICS_TOKEN = "scrape-token"
    job = make_job(status=Job.Status.RUNNING)
    AlertRoute.objects.create(name="hook", channel="webhook", target="http://127.0.0.1:9/")
    raise_alert(f"job-failed:{job.pk}", "job-failed", job=job, summary="wc failed")
    raise_alert(f"restarts:{job.pk}", "restarts", job=job, summary="restarts")
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-token").content.decode()
    assert 'backstop_alerts_open{event="job-failed",severity="critical"} 1.0' in text
    assert 'backstop_alert_deliveries{action="trigger",route="hook",status="pending"} 2.0' in text


def test_alerts_are_listed_with_how_many_checks_saw_them(api_as, monkeypatch):
    monkeypatch.setattr("console.services.alert_routing.enqueue", lambda ids: None)
    job = make_job(status=Job.Status.RUNNING)
    for _ in range(3):
        raise_alert(f"restarts:{job.pk}", "restarts", job=job, summary="6 failures")
    raise_alert(f"job-failed:{job.pk}", "job-failed", job=job, summary="failed")
    clear_alert(f"job-failed:{job.pk}")
    rows = api_as(OPERATOR).get("/api/alerts/?state=open").json()["results"]
    assert [(r["key"], r["seen"], r["severity"], r["job"]) for r in rows] == [
        (f"restarts:{job.pk}", 3, "warning", job.pk)
    ]
    assert api_as(VIEWER).get("/api/alerts/").status_code == 403
