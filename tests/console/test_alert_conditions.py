"""The conditions ops teams page on, as the controller's policy cycle raises and clears them
(console.services.control.record.watch_conditions) against the real database and Redis: one
alert per condition however many cycles see it, a resolve when it clears, thresholds from the
policy (bounded, each change a new audited version)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from console.models import Alert, AlertDelivery, AlertRoute, Job, Policy
from console.policy.config import PolicyConfig
from console.redis import redis_client
from console.roles import ADMIN
from console.services import controller, kafka_status
from console.services.control import record
from infra import keys as control_keys
from spark_runtime import keys as data_keys
from spark_runtime.progress import publish_progress
from tests.factories import make_job, progress_record

pytestmark = pytest.mark.django_db

CONFIG = replace(PolicyConfig(), alert_unprotected_s=60.0, alert_no_output_s=30.0)


@pytest.fixture
def running(monkeypatch):
    """A running job started a minute ago, a webhook route hearing everything, its Redis keys
    removed at the end; no message leaves for the alerts worker."""
    monkeypatch.setattr(record.alert_routing, "enqueue", lambda ids: None)
    job = make_job(Job.Status.RUNNING, name="wc")
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=1))
    job.refresh_from_db()
    AlertRoute.objects.create(
        name="all", channel="webhook", target="http://127.0.0.1:9/", min_severity="info"
    )
    client = redis_client()
    yield job, client
    data_keys.delete_job_keys(client, job.key)
    client.delete(*control_keys.controller_job_keys(job.key))


def supervisor(unprotected=None, failures=None):
    """What watch_conditions reads of the supervision state machine."""
    return SimpleNamespace(
        active_stages={"count"},
        unprotected_since=unprotected or {},
        failures=failures or {},
    )


def watch(job, client, machine, now, progress=(), kafka_due=(), config=CONFIG):
    return record.watch_conditions(
        job, machine, client, config, list(progress), list(kafka_due), now=now
    )


def triggers_and_resolves() -> list[tuple[str, str]]:
    return sorted(AlertDelivery.objects.values_list("alert__key", "action"))


def test_a_stage_unprotected_past_the_limit_pages_once_and_resolves_when_protected(running):
    job, client = running
    now = time.time()
    machine = supervisor(unprotected={"count": now - 30})
    assert watch(job, client, machine, now) == {}  # 30 s: under the 60 s limit
    for cycle in range(10):
        held = watch(job, client, machine, now + 40 + 5 * cycle)
        assert list(held) == [f"job-unprotected:{job.key}:count"]
    alert = Alert.objects.get()
    assert (alert.event, alert.severity, alert.seen) == ("job-unprotected", "error", 10)
    assert "stage count has run 70 s without its standby (limit 60 s)" in alert.summary
    machine.unprotected_since.clear()  # a new standby caught up
    watch(job, client, machine, now + 100)
    watch(job, client, machine, now + 105)
    alert.refresh_from_db()
    assert alert.state == "resolved"
    key = f"job-unprotected:{job.key}:count"
    assert triggers_and_resolves() == [(key, "resolve"), (key, "trigger")]


def test_a_stage_without_the_policys_protection_is_not_alerted(running):
    job, client = running
    now = time.time()
    machine = supervisor(unprotected={"split": now - 600})  # not an active stage
    assert watch(job, client, machine, now) == {}


def test_no_output_while_input_arrives_pages_and_output_clears_it(running):
    job, client = running
    now = time.time()
    reading = progress_record(at=now, input_rows=50, written=40)
    watch(job, client, supervisor(), now, [reading])  # output at `now`
    starving = progress_record(at=now + 35, input_rows=50, written=0, batch=1)
    assert list(watch(job, client, supervisor(), now + 35, [starving])) == [
        f"output-stalled:{job.key}"
    ]
    assert "no output for 35 s while input arrives" in Alert.objects.get().summary
    # No input either: nothing is stalled, the job is idle.
    assert watch(job, client, supervisor(), now + 80) == {}
    assert Alert.objects.get().state == "resolved"


def test_a_stuck_job_whose_input_stream_grows_is_stalled(running):
    """No batch at all (nothing reads the input), but the generator keeps writing: the input
    stream's newest entry says input arrives."""
    job, client = running
    now = time.time()
    watch(job, client, supervisor(), now, [progress_record(at=now, input_rows=5, written=5)])
    client.xadd(data_keys.input_stream(job.key), {"text": "a b"}, id=f"{int((now + 33) * 1000)}-0")
    assert list(watch(job, client, supervisor(), now + 35)) == [f"output-stalled:{job.key}"]


def test_restarts_over_the_count_in_the_window(running):
    job, client = running
    now = time.time()
    config = replace(CONFIG, alert_restarts_count=3, alert_restarts_window_s=60.0)
    machine = supervisor(failures={"count/primary": [now - 100, now - 50, now - 20]})
    assert watch(job, client, machine, now, config=config) == {}  # 2 within 60 s
    machine.failures["count/primary"].append(now - 1)
    (key,) = watch(job, client, machine, now, config=config)
    assert key == f"restarts:{job.key}" and Alert.objects.get().details["failures"] == 3


def test_slow_and_failing_checkpoints(running):
    job, client = running
    now = time.time()
    config = replace(CONFIG, alert_checkpoint_duration_s=2.0)
    slow = progress_record(at=now, batch_ms=4500.0, input_rows=1, written=1)
    client.hset(
        data_keys.replicas(job.key),
        "count-0",
        json.dumps(
            {"stage": "count", "role": "primary", "state": "failed",
             "error": "HDFSBackedStateStore: failed to commit version 12"}
        ),
    )  # fmt: skip
    held = watch(job, client, supervisor(), now, [slow], config=config)
    assert set(held) == {f"checkpoint-slow:{job.key}:count", f"checkpoint-failing:{job.key}:count"}
    assert held[f"checkpoint-slow:{job.key}:count"]["details"]["duration_s"] == 4.5


def test_kafka_conditions_become_alerts(running):
    job, client = running
    now = time.time()
    lag = kafka_status.KafkaAlert(kafka_status.LAG, "1.0", {"total": 12000, "limit": 5000})
    (key,) = watch(job, client, supervisor(), now, kafka_due=[lag])
    assert key == f"kafka-lag:{job.key}"
    assert Alert.objects.get().summary == "wc: 12,000 records behind (limit 5,000)"
    watch(job, client, supervisor(), now + 5)
    assert Alert.objects.get().state == "resolved"


def test_a_failed_job_pages_and_resolves_when_it_runs_again(running):
    job, client = running
    Job.objects.filter(pk=job.pk).update(status=Job.Status.FAILED, status_reason="8 failures")
    job.refresh_from_db()
    record.alert_failed_job(job)
    record.alert_failed_job(job)  # the same failure recorded again: one alert
    alert = Alert.objects.get(key__startswith=f"job-failed:{job.key}:")
    assert (alert.severity, alert.state) == ("critical", "open")
    assert alert.summary == "wc failed: 8 failures"
    # Restarted from its checkpoints: a new run, and its first cycle clears the alert.
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
    job.refresh_from_db()
    watch(job, client, supervisor(), time.time())
    alert.refresh_from_db()
    assert alert.state == "resolved"


def test_a_stopped_job_resolves_its_alerts(running):
    job, client = running
    now = time.time()
    watch(job, client, supervisor(unprotected={"count": now - 90}), now)
    record.clear_alerts_of_ended_job(job, client)
    assert Alert.objects.get().state == "resolved"


def test_reconcile_failures_page_at_the_streak_and_resolve_when_it_ends(running):
    job, client = running
    for failures in range(1, 6):
        record.record_reconcile_failure(client, job, failures, "OperationalError: db", 1.0, "c1")
    alert = Alert.objects.get()
    assert alert.key == f"reconcile-failing:{job.key}" and alert.details["failures"] == 5
    record.clear_reconcile_failure(client, job.key)
    alert.refresh_from_db()
    assert alert.state == "resolved"


def test_the_thresholds_are_bounded_policy_fields_changed_as_audited_versions(api_as):
    admin = api_as(ADMIN)
    refused = admin.patch(
        "/api/policy/", {"alert_unprotected_s": -1, "reason": "try"}, format="json"
    )
    assert refused.status_code == 400
    assert "alert_unprotected_s: must be between 0 and 86400" in str(refused.json())
    changed = admin.patch(
        "/api/policy/",
        {"alert_unprotected_s": 30, "alert_restarts_count": 3, "reason": "page sooner"},
        format="json",
    )
    assert changed.status_code == 201, changed.json()
    policy = Policy.current()
    assert policy.changes_from_previous() == {
        "alert_unprotected_s": [120.0, 30.0],
        "alert_restarts_count": [5, 3],
    }
    assert policy.created_by.username == "ada" and policy.reason == "page sooner"


def test_a_reconcile_raises_a_supervision_condition_before_the_next_cycle(running):
    job, client = running
    config = replace(CONFIG, alert_unprotected_s=0.5)
    machine = supervisor(unprotected={"count": time.time() - 1})
    key = f"job-unprotected:{job.key}:count"
    assert record.raise_supervision_alerts(job, machine, client, config) == [key]
    # Every later reconcile: already raised, nothing written.
    assert record.raise_supervision_alerts(job, machine, client, config) == []
    assert Alert.objects.get().seen == 1
    # The cycle keeps it open while it holds, and clears it once a standby caught up.
    watch(job, client, machine, time.time(), config=config)
    assert Alert.objects.get().state == "open"
    machine.unprotected_since.clear()
    assert record.raise_supervision_alerts(job, machine, client, config) == []
    watch(job, client, machine, time.time(), config=config)
    assert Alert.objects.get().state == "resolved"


def test_a_condition_turning_true_between_policy_cycles_is_raised_at_the_next_look(running):
    """Policy cycles are cycle_interval_s apart (5 s by default); the looks between them
    (controller.watch_between_cycles) read the progress records the stages published since
    the last look and raise a new condition at once. Repeats are counted and conditions
    cleared by the cycle only."""
    job, client = running
    config = replace(CONFIG, alert_no_output_s=2.0)
    now = time.time()
    watch(job, client, supervisor(), now - 10, config=config)  # the cycle watched this run
    slot = SimpleNamespace(progress_seen=None)
    output = progress_record(at=now - 3, input_rows=20, written=20)
    publish_progress(client, job.key, output)
    controller.watch_between_cycles(job, supervisor(), client, config, slot)
    assert Alert.objects.count() == 0  # input and output 3 s ago: idle, not stalled
    starving = progress_record(at=now, input_rows=20, written=0, batch=1)
    publish_progress(client, job.key, starving)
    # The activity moved on with the first record: output 3 s ago, input now, limit 2 s.
    controller.watch_between_cycles(job, supervisor(), client, config, slot)
    alert = Alert.objects.get()
    assert (alert.key, alert.state, alert.seen) == (f"output-stalled:{job.key}", "open", 1)
    # The next looks read nothing new and write nothing.
    for _ in range(3):
        controller.watch_between_cycles(job, supervisor(), client, config, slot)
    alert.refresh_from_db()
    assert alert.seen == 1
    # The cycle still counts it, then clears it once output comes back.
    watch(job, client, supervisor(), now + 1, config=config)
    alert.refresh_from_db()
    assert alert.seen == 2
    back = progress_record(at=now + 2, input_rows=20, written=20, batch=2)
    watch(job, client, supervisor(), now + 2, [back], config=config)
    alert.refresh_from_db()
    assert alert.state == "resolved"
