"""The channels' payloads and the retry schedule, without a database (console.alerting_payloads,
console.policy.alert_conditions)."""

from __future__ import annotations

import hashlib
import hmac
import json

from console import alerting_payloads as payloads
from console.policy import alert_conditions as conditions

FACTS = payloads.AlertFacts(
    key="kafka-lag:7",
    event="kafka-lag",
    severity="warning",
    action=payloads.TRIGGER,
    summary="clicks is 12,000 records behind",
    source="job clicks (id 7)",
    details={"total": 12000, "limit": 5000},
    opened_at=1_700_000_000.0,
    link="http://console.example/console/jobs/7/",
)


def test_the_webhook_signature_covers_the_timestamp_and_the_exact_body():
    request = payloads.webhook_request("http://r.example/h", "k", FACTS, now=1_700_000_005.9)
    assert request.headers["X-Backstop-Timestamp"] == "1700000005"
    mac = hmac.new(b"k", b"1700000005." + request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Backstop-Signature"] == f"sha256={mac}"
    assert json.loads(request.body)["details"] == {"total": 12000, "limit": 5000}


def test_pagerduty_trigger_and_resolve_follow_events_api_v2():
    trigger = json.loads(payloads.pagerduty_request("http://pd/e", "RK", FACTS).body)
    assert trigger["routing_key"] == "RK" and trigger["dedup_key"] == "kafka-lag:7"
    assert trigger["event_action"] == "trigger"
    assert {k: trigger["payload"][k] for k in ("summary", "source", "severity")} == {
        "summary": "clicks is 12,000 records behind",
        "source": "job clicks (id 7)",
        "severity": "warning",
    }
    resolved = payloads.AlertFacts(**{**FACTS.__dict__, "action": payloads.RESOLVE})
    resolve = json.loads(payloads.pagerduty_request("http://pd/e", "RK", resolved).body)
    assert resolve == {"routing_key": "RK", "event_action": "resolve", "dedup_key": "kafka-lag:7"}


def test_slack_and_email_say_the_severity_and_the_summary():
    slack = json.loads(payloads.slack_request("http://hooks.slack/x", FACTS).body)
    assert slack["text"] == ":warning: [warning] clicks is 12,000 records behind"
    subject, body = payloads.email_message(FACTS, "[Backstop] ")
    assert subject == "[Backstop] [warning] clicks is 12,000 records behind"
    assert "limit: 5000" in body and FACTS.link in body


def test_retries_back_off_exponentially_up_to_the_cap():
    delays = [payloads.retry_delay_s(n) for n in range(1, 9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    # A receiver down for 60 s: the attempts before it returns, and the wait after it at most.
    assert sum(delays[:6]) == 61.0 and max(delays) == payloads.RETRY_MAX_DELAY_S


def test_severities_order_like_pagerduty():
    assert payloads.severity_at_least("critical", "error")
    assert not payloads.severity_at_least("warning", "error")
    assert {severity for severity, _ in payloads.EVENTS.values()} <= set(payloads.SEVERITIES)


def test_conditions_from_numbers():
    assert conditions.unprotected_stages({"a": 0.0, "b": 90.0}, ["a", "b"], 100.0, 60.0) == {
        "a": 100.0
    }
    assert conditions.unprotected_stages({"a": 0.0}, [], 100.0, 60.0) == {}  # not protected
    assert conditions.unprotected_stages({"a": 0.0}, ["a"], 100.0, 0.0) == {}  # off
    # Input within the limit, output older than it: stalled; no input lately: not stalled.
    assert conditions.output_stalled(10.0, 95.0, 0.0, 100.0, 60.0)
    assert not conditions.output_stalled(50.0, 95.0, 0.0, 100.0, 60.0)
    assert not conditions.output_stalled(10.0, 30.0, 0.0, 100.0, 60.0)
    assert conditions.output_stalled(None, 95.0, 20.0, 100.0, 60.0)
    assert not conditions.output_stalled(None, 95.0, 50.0, 100.0, 60.0)
    assert conditions.restarts_over([10.0, 50.0, 90.0, 95.0], 100.0, 60.0, 3) == 3
    assert conditions.restarts_over([10.0, 95.0], 100.0, 60.0, 3) == 0
    assert conditions.slow_batches({"a": 4000.0, "b": 500.0}, 2.0) == {"a": 4.0}
    assert conditions.checkpoint_failures(
        {"a": "HDFSBackedStateStore commit failed", "b": "ZeroDivisionError"}
    ) == {"a": "HDFSBackedStateStore commit failed"}
