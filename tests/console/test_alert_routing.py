"""Alert routing against real HTTP receivers on loopback (tests/receivers.py): each channel's
payload as the receiver got it (the webhook's signature checked here with hmac/hashlib, not
with the code under test), retries across a receiver's outage, one page for many checks of one
condition, the resolve, the throttle of a flapping condition, and who a route reaches."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from bench.receivers import Receiver, free_port
from console.models import Alert, AlertDelivery, AlertRoute, Job, Policy, Team
from console.services import alert_routing
from console.services.alert_routing import clear_alert, deliver, raise_alert
from tests.factories import make_job

pytestmark = pytest.mark.django_db

SECRET = "s3cret-for-tests"


def route(name="ops", channel=AlertRoute.Channel.WEBHOOK, target="", **fields) -> AlertRoute:
    teams = fields.pop("teams", [])
    jobs = fields.pop("jobs", [])
    made = AlertRoute.objects.create(
        name=name, channel=channel, target=target, secret=fields.pop("secret", SECRET), **fields
    )
    made.teams.set(teams)
    made.jobs.set(jobs)
    return made


def deliver_due(now=None) -> list[float | None]:
    """One attempt at every pending delivery that is due at `now` (what the worker does)."""
    now = now or timezone.now()
    pending = AlertDelivery.objects.filter(status=AlertDelivery.Status.PENDING).order_by("pk")
    return [deliver(pk, now=now) for pk in pending.values_list("pk", flat=True)]


def unprotected(job: Job, **overrides) -> Alert:
    fields = {
        "job": job,
        "summary": f"{job.name}: stage count ran 130 s without its standby",
        "details": {"stage": "count", "unprotected_s": 130},
        **overrides,
    }
    return raise_alert(f"job-unprotected:{job.pk}:count", "job-unprotected", **fields)


def test_the_webhook_posts_signed_json_that_the_receiver_can_verify():
    job = make_job(status=Job.Status.RUNNING)
    with Receiver() as receiver:
        route(target=receiver.url)
        alert = unprotected(job)
        deliver_due()
        (request,) = receiver.wait_for(1)
    timestamp = request.headers["X-Backstop-Timestamp"]
    expected = hmac.new(SECRET.encode(), timestamp.encode() + b"." + request.body, hashlib.sha256)
    assert request.headers["X-Backstop-Signature"] == "sha256=" + expected.hexdigest()
    wrong = hmac.new(b"another", timestamp.encode() + b"." + request.body, hashlib.sha256)
    assert request.headers["X-Backstop-Signature"] != "sha256=" + wrong.hexdigest()
    assert request.headers["Content-Type"] == "application/json"
    body = request.json()
    assert body["key"] == alert.key == f"job-unprotected:{job.pk}:count"
    assert (body["action"], body["event"], body["severity"]) == (
        "trigger",
        "job-unprotected",
        "error",
    )
    assert body["details"] == {"stage": "count", "unprotected_s": 130}
    assert body["source"] == f"job wc (id {job.pk})"
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("delivered", 1, 200)


def test_slack_gets_its_incoming_webhook_json():
    job = make_job(status=Job.Status.RUNNING)
    with Receiver() as receiver:
        route(channel=AlertRoute.Channel.SLACK, target=receiver.url)
        unprotected(job)
        deliver_due()
        clear_alert(f"job-unprotected:{job.pk}:count")
        deliver_due()
        trigger, resolve = (r.json() for r in receiver.wait_for(2))
    # Slack's incoming webhooks take `text` (the notification) and optional Block Kit `blocks`.
    assert trigger["text"] == f":x: [error] {job.name}: stage count ran 130 s without its standby"
    (block,) = trigger["blocks"]
    assert block["type"] == "section" and block["text"]["type"] == "mrkdwn"
    assert f"job-unprotected:{job.pk}:count" in block["text"]["text"]
    assert resolve["text"].startswith(":white_check_mark: Resolved: ")


def test_pagerduty_gets_a_trigger_then_a_resolve_with_one_dedup_key():
    job = make_job(status=Job.Status.RUNNING)
    with Receiver(status=202) as receiver:
        route(channel=AlertRoute.Channel.PAGERDUTY, target=receiver.url, secret="R0UT1NGKEY")
        raise_alert(f"job-failed:{job.pk}", "job-failed", job=job, summary="wc failed: 8 failures")
        deliver_due()
        clear_alert(f"job-failed:{job.pk}")
        deliver_due()
        trigger, resolve = (r.json() for r in receiver.wait_for(2))
    assert trigger["routing_key"] == resolve["routing_key"] == "R0UT1NGKEY"
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["dedup_key"] == resolve["dedup_key"] == f"job-failed:{job.pk}"
    assert trigger["payload"]["summary"] == "wc failed: 8 failures"
    assert trigger["payload"]["source"] == f"job wc (id {job.pk})"
    assert trigger["payload"]["severity"] == "critical"
    assert "payload" not in resolve  # Events API v2: a resolve carries the key only
    statuses = AlertDelivery.objects.values_list("action", "status", "response_status")
    assert sorted(statuses) == [("resolve", "delivered", 202), ("trigger", "delivered", 202)]


def test_the_email_channel_mails_the_route_addresses():
    job = make_job(status=Job.Status.RUNNING)
    route(channel=AlertRoute.Channel.EMAIL, target="ops@example.com, sre@example.com")
    unprotected(job)
    deliver_due()
    (message,) = mail.outbox
    assert message.to == ["ops@example.com", "sre@example.com"]
    assert "[error]" in message.subject and "without its standby" in message.subject
    assert f"Key: job-unprotected:{job.pk}:count" in message.body


def test_a_receiver_down_then_back_gets_the_alert_after_retries_with_backoff():
    job = make_job(status=Job.Status.RUNNING)
    receiver = Receiver(port=free_port())  # not started: the receiver is down
    route(target=receiver.url)
    unprotected(job)
    start = timezone.now()
    assert deliver_due(start) == [1.0]
    assert deliver_due(start + timedelta(seconds=0.2)) == [None]  # not due yet: nothing sent
    assert deliver_due(start + timedelta(seconds=1)) == [2.0]
    assert deliver_due(start + timedelta(seconds=3)) == [4.0]
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("pending", 3)
    assert "Connection refused" in delivery.last_error
    receiver.start()
    try:
        assert deliver_due(start + timedelta(seconds=7)) == [None]
        assert len(receiver.wait_for(1)) == 1
    finally:
        receiver.stop()
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error) == ("delivered", 4, "")


def test_a_receiver_that_answers_an_error_is_retried_and_a_dead_one_is_given_up(monkeypatch):
    job = make_job(status=Job.Status.RUNNING)
    monkeypatch.setattr(alert_routing.payloads, "MAX_ATTEMPTS", 2)
    with Receiver(status=503) as receiver:
        route(target=receiver.url)
        unprotected(job)
        start = timezone.now()
        assert deliver_due(start) == [1.0]
        assert deliver_due(start + timedelta(seconds=1)) == [None]
        receiver.wait_for(2)
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("failed", 2, 503)
    assert delivery.last_error.startswith("SendFailed: HTTP 503")


def test_a_hung_receiver_costs_one_timeout_not_the_worker(monkeypatch):
    job = make_job(status=Job.Status.RUNNING)
    monkeypatch.setattr(alert_routing, "HTTP_TIMEOUT_S", 0.5)
    with Receiver(hang=True) as receiver:
        route(target=receiver.url)
        unprotected(job)
        assert deliver_due() == [1.0]
    delivery = AlertDelivery.objects.get()
    assert delivery.status == "pending" and "timed out" in delivery.last_error


def test_many_checks_of_one_condition_page_once_and_its_clearing_resolves_once():
    job = make_job(status=Job.Status.RUNNING)
    with Receiver() as receiver:
        route(target=receiver.url)
        for _ in range(50):
            unprotected(job)
            deliver_due()
        for _ in range(5):
            clear_alert(f"job-unprotected:{job.pk}:count")
            deliver_due()
        requests = receiver.wait_for(2)
    assert [r.json()["action"] for r in requests] == ["trigger", "resolve"]
    alert = Alert.objects.get()
    assert (alert.seen, alert.state) == (50, "resolved")
    assert AlertDelivery.objects.count() == 2


def test_a_condition_back_within_the_throttle_stays_resolved_and_pages_again_after_it():
    job = make_job(status=Job.Status.RUNNING)
    route(target="http://127.0.0.1:9/unused")
    throttle_s = Policy.current().alert_reopen_throttle_s
    assert throttle_s == 300.0
    start = timezone.now()
    unprotected(job, now=start)
    clear_alert(f"job-unprotected:{job.pk}:count", now=start + timedelta(seconds=10))
    flap = unprotected(job, now=start + timedelta(seconds=20))
    assert flap.state == "resolved"
    assert AlertDelivery.objects.filter(action="trigger").count() == 1
    later = unprotected(job, now=start + timedelta(seconds=10 + throttle_s + 1))
    assert later.state == "open"
    assert AlertDelivery.objects.filter(action="trigger").count() == 2


def test_a_resolve_waits_for_its_trigger():
    job = make_job(status=Job.Status.RUNNING)
    with Receiver() as receiver:
        route(target=receiver.url)
        unprotected(job)
        clear_alert(f"job-unprotected:{job.pk}:count")
        resolve = AlertDelivery.objects.get(action="resolve")
        now = timezone.now()
        assert deliver(resolve.pk, now=now) == 1.0  # its trigger has not gone yet
        trigger = AlertDelivery.objects.get(action="trigger")
        assert deliver(trigger.pk, now=now) is None
        assert deliver(resolve.pk, now=now + timedelta(seconds=1)) is None
        actions = [r.json()["action"] for r in receiver.wait_for(2)]
    assert actions == ["trigger", "resolve"]


def test_a_delivery_claimed_by_one_worker_is_not_sent_by_another():
    job = make_job(status=Job.Status.RUNNING)
    with Receiver() as receiver:
        route(target=receiver.url)
        unprotected(job)
        delivery = AlertDelivery.objects.get()
        now = timezone.now()
        # The claim another worker would make first: the row is not due for CLAIM_S.
        AlertDelivery.objects.filter(pk=delivery.pk).update(
            next_attempt_at=now + timedelta(seconds=alert_routing.CLAIM_S)
        )
        assert deliver(delivery.pk, now=now) is None
        assert receiver.requests == []
        assert alert_routing.due_deliveries(now) == []
        overdue = now + timedelta(seconds=alert_routing.CLAIM_S + alert_routing.SWEEP_GRACE_S + 1)
        assert alert_routing.due_deliveries(overdue) == [delivery.pk]  # the sweep's pick


def test_routes_choose_events_severity_teams_and_jobs():
    payments, search = Team.named("payments"), Team.named("search")
    paid = make_job(status=Job.Status.RUNNING, name="paid")
    Job.objects.filter(pk=paid.pk).update(team=payments)
    paid.refresh_from_db()
    other = make_job(status=Job.Status.RUNNING, name="other")
    everything = route("everything", target="http://127.0.0.1:9/a", min_severity="info")
    critical_only = route("critical", target="http://127.0.0.1:9/b", min_severity="critical")
    lag_only = route("lag", target="http://127.0.0.1:9/c", events=["kafka-lag"])
    team_route = route("payments", target="http://127.0.0.1:9/d", teams=[payments])
    search_route = route("search", target="http://127.0.0.1:9/e", teams=[search])
    other_route = route("other-job", target="http://127.0.0.1:9/f", jobs=[other])
    route("off", target="http://127.0.0.1:9/g", enabled=False)

    def reached(alert):
        return {d.route for d in alert.deliveries.all()}

    assert reached(unprotected(paid)) == {everything, team_route}
    assert reached(unprotected(other)) == {everything, other_route}
    failed = raise_alert(f"job-failed:{paid.pk}", "job-failed", job=paid, summary="failed")
    assert reached(failed) == {everything, critical_only, team_route}
    lag = raise_alert(f"kafka-lag:{other.pk}", "kafka-lag", job=other, summary="behind")
    assert reached(lag) == {everything, lag_only, other_route}
    assert search_route not in AlertDelivery.objects.values_list("route", flat=True)


def test_the_controller_only_queues_one_message_per_delivery(monkeypatch):
    sent = []
    monkeypatch.setattr(
        alert_routing.tasks, "send", lambda task, *args, **kw: sent.append((task, args, kw))
    )
    job = make_job(status=Job.Status.RUNNING)
    route(target="http://127.0.0.1:9/a")
    route("second", target="http://127.0.0.1:9/b")
    alert_routing.enqueue(list(AlertDelivery.objects.values_list("pk", flat=True)))
    assert sent == []
    unprotected(job)
    ids = list(AlertDelivery.objects.order_by("pk").values_list("pk", flat=True))
    alert_routing.enqueue(ids)
    assert [(t.name, a, k) for t, a, k in sent] == [
        ("backstop.alerts.deliver", (pk,), {"queue": "alerts"}) for pk in ids
    ]
    assert all(json.dumps(a) for _, a, _ in sent)  # the message is JSON
