"""Retention: old and new rows of every kind are seeded around a fixed `now`, one purge runs, and
exactly the old ones are gone (the progress stream in Redis too); the audits of purged episodes
are folded into one that stays, so the sums over a job's episodes do not change; purges go in
batches and stop at their deadline; the beat task is scheduled and registered."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from celery import current_app
from django.db.models import Sum
from django.utils import timezone

from console.models import (
    Alert,
    AlertDelivery,
    AlertRoute,
    ControlDecision,
    FaultInjection,
    Job,
    MetricSample,
    RecoveryEpisode,
    Replica,
)
from console.redis import redis_client
from console.services import retention
from console.services.alert_routing import clear_alert, raise_alert
from console.services.schedules import PERIODIC_TASKS, ensure_periodic_tasks
from infra import keys as control_keys
from infra import tasks
from spark_runtime import keys as data_keys
from tests.factories import (
    EpisodeFactory,
    FaultFactory,
    MetricFactory,
    NodeFactory,
    ReplicaFactory,
    make_job,
)

pytestmark = pytest.mark.django_db

POLICY = retention.Retention(
    metric_hours=48,
    decision_days=30,
    episode_days=30,
    fault_days=30,
    progress_hours=48,
    batch_rows=3,  # several batches for a handful of rows
    max_seconds=60,
)


@pytest.fixture
def now():
    return timezone.now().replace(microsecond=0)


@pytest.fixture
def redis():
    client = redis_client()
    yield client
    for key in client.scan_iter(match=f"{data_keys.job_prefix('job-retention')}*"):
        client.delete(key)


def ago(now, **delta):
    return now - timedelta(**delta)


def seed(now):
    """Old and new rows of every kind; returns the pks that must stay, by model."""
    job = make_job(Job.Status.RUNNING, name="kept")
    other = make_job(Job.Status.STOPPED, name="other")
    keep = {"metrics": set(), "decisions": set(), "episodes": set(), "faults": set()}
    for hours, stays in ((49, False), (48.5, False), (47.9, True), (1, True)):
        for target in ({"job": job, "stage": ""}, {"node": None, "job": other, "stage": "x"}):
            sample = MetricFactory(at=ago(now, hours=hours), **target)
            if stays:
                keep["metrics"].add(sample.pk)
    for days, stays in ((45, False), (30.1, False), (29.9, True), (0, True)):
        decision = ControlDecision.objects.create(
            job=job, at=ago(now, days=days), kind="set-interval", reason="r"
        )
        if stays:
            keep["decisions"].add(decision.pk)
    # Episodes of `job`: three old audited ones (folded into the newest of them), one old closed
    # unaudited (goes), one old still open (stays), one new audited (stays).
    old_faults = []
    for days, lost, dup in ((40, 2, 1), (35, 3, 0), (31, 1, 4)):
        fault = FaultFactory(job=job, outcome="injected", injected_at=ago(now, days=days))
        FaultInjection.objects.filter(pk=fault.pk).update(requested_at=ago(now, days=days))
        old_faults.append(fault)
        EpisodeFactory(
            job=job, fault=fault, detected_at=ago(now, days=days), watched_s=30.0,
            lost=lost, duplicates=dup, notes="measured",
        )  # fmt: skip
    carrier = RecoveryEpisode.objects.get(fault=old_faults[-1])
    keep["episodes"].add(carrier.pk)
    keep["faults"].add(old_faults[-1].pk)  # its episode stays
    EpisodeFactory(job=job, detected_at=ago(now, days=33), watched_s=30.0)  # unaudited: goes
    still_open = EpisodeFactory(job=job, detected_at=ago(now, days=50), watched_s=None)
    recent = EpisodeFactory(
        job=job, detected_at=ago(now, days=2), watched_s=20.0, lost=5, duplicates=0
    )
    keep["episodes"] |= {still_open.pk, recent.pk}
    # An old audited episode of another job, alone: nothing to fold, it stays.
    alone = EpisodeFactory(job=other, detected_at=ago(now, days=60), watched_s=9.0, lost=0,
                           duplicates=0)  # fmt: skip
    keep["episodes"].add(alone.pk)
    # Faults: old and pending stays (not settled), old and refused goes, new stays.
    pending = FaultFactory(job=job, outcome="pending")
    refused = FaultFactory(job=job, outcome="refused")
    fresh = FaultFactory(job=job, outcome="injected")
    FaultInjection.objects.filter(pk__in=[pending.pk, refused.pk]).update(
        requested_at=ago(now, days=31)
    )
    keep["faults"] |= {pending.pk, fresh.pk}
    return job, other, keep


def test_a_purge_removes_exactly_the_old_rows_of_every_kind(now, redis):
    job, other, keep = seed(now)
    lost_before = RecoveryEpisode.objects.filter(job=job).aggregate(
        lost=Sum("lost"), duplicates=Sum("duplicates")
    )
    purged = retention.purge_old_records(None, POLICY, now=now)
    assert set(MetricSample.objects.values_list("pk", flat=True)) == keep["metrics"]
    assert set(ControlDecision.objects.values_list("pk", flat=True)) == keep["decisions"]
    assert set(RecoveryEpisode.objects.values_list("pk", flat=True)) == keep["episodes"]
    assert set(FaultInjection.objects.values_list("pk", flat=True)) == keep["faults"]
    assert purged == {
        "decisions": 2,
        "episodes": 3,  # two folded, one unaudited
        "faults": 3,  # the refused one and the two whose episodes were folded away
        "audit_events": 0,
        "alerts": 0,
        "progress_entries": 0,
        "metrics": 4,
        "run_keys": 0,
        "finished": True,
    }
    # The audits of the two folded episodes live on in the one kept.
    lost_after = RecoveryEpisode.objects.filter(job=job).aggregate(
        lost=Sum("lost"), duplicates=Sum("duplicates")
    )
    assert lost_after == lost_before
    carrier = RecoveryEpisode.objects.filter(job=job, detected_at__lt=ago(now, days=30)).exclude(
        watched_s=None
    )
    (carrier,) = carrier
    assert (carrier.lost, carrier.duplicates) == (2 + 3 + 1, 1 + 0 + 4)
    assert carrier.notes == "measured [retention: also the audit of 2 purged older episodes]"
    # A second run finds nothing more, and a later fold adds to the carried count.
    again = retention.purge_old_records(None, POLICY, now=now)
    assert {k: v for k, v in again.items() if k != "finished"} == dict.fromkeys(
        (
            "decisions",
            "episodes",
            "faults",
            "audit_events",
            "alerts",
            "progress_entries",
            "metrics",
            "run_keys",
        ),
        0,
    )
    later = EpisodeFactory(job=job, detected_at=ago(now, days=30, hours=1), watched_s=3.0,
                           lost=1, duplicates=1)  # fmt: skip
    retention.purge_old_records(None, POLICY, now=now)
    assert not RecoveryEpisode.objects.filter(pk=carrier.pk).exists()
    newest = RecoveryEpisode.objects.get(pk=later.pk)
    assert (newest.lost, newest.duplicates) == (7, 6)
    assert newest.notes.endswith("[retention: also the audit of 3 purged older episodes]")


def test_progress_streams_keep_the_last_hours_and_ended_jobs_lose_theirs(now, redis):
    running = make_job(Job.Status.RUNNING, name="running")
    ended = make_job(Job.Status.STOPPED, name="ended")
    now_s = now.timestamp()
    ids = {}
    for job in (running, ended):
        stream = data_keys.progress(job.key)
        redis.delete(stream)
        offsets = (50, 49, 47, 1) if job is running else (72, 60)
        ids[job.pk] = [
            redis.xadd(stream, {"batch": str(i)}, id=f"{int((now_s - h * 3600) * 1000)}-0")
            for i, h in enumerate(offsets)
        ]
    try:
        trimmed = retention.trim_progress(redis, 48, now_s=now_s)
        assert trimmed == 2 + 2
        kept = [entry_id for entry_id, _ in redis.xrange(data_keys.progress(running.key))]
        assert kept == ids[running.pk][2:]
        assert not redis.exists(data_keys.progress(ended.key))
    finally:
        for job in (running, ended):
            redis.delete(data_keys.progress(job.key))


def test_an_ended_runs_keys_go_and_its_kept_data_stays(redis):
    running = make_job(Job.Status.RUNNING, name="running")
    stopped = make_job(Job.Status.STOPPED, name="stopped")
    stopping = make_job(Job.Status.FAILED, name="failed-but-a-replica-still-runs")
    ReplicaFactory(job=stopping, node=NodeFactory(), state=Replica.State.RUNNING)
    # A Kafka job's plan log and source and sink stay for a restart; its replicas' lag goes.
    kept = {
        data_keys.results(stopped.key),
        control_keys.agent_events_cursor(stopped.key),
        data_keys.kafka_plans(stopped.key),
        data_keys.external_io(stopped.key),
    }
    assert data_keys.kafka_lag(stopped.key) in retention.run_keys(stopped.key)
    for job in (running, stopped, stopping):
        for key in retention.run_keys(job.key):
            redis.set(key, "x")
    for key in kept:
        redis.set(key, "x")
    redis.set(control_keys.ingest_cursor(data_keys.progress(stopped.key)), "1-0")
    try:
        assert retention.forget_ended_runs(redis) == len(retention.run_keys(stopped.key))
        assert not any(redis.exists(key) for key in retention.run_keys(stopped.key))
        for job in (running, stopping):
            assert all(redis.exists(key) for key in retention.run_keys(job.key)), job.name
        assert all(redis.exists(key) for key in kept)
        # The ingest cursor goes with the progress stream (empty: the job ended).
        retention.trim_progress(redis, 48)
        assert not redis.exists(control_keys.ingest_cursor(data_keys.progress(stopped.key)))
    finally:
        for job in (running, stopped, stopping):
            redis.delete(*retention.run_keys(job.key))
        redis.delete(*kept)


def test_a_purge_goes_in_batches_and_stops_at_its_deadline(now):
    job = make_job(Job.Status.RUNNING)
    MetricSample.objects.bulk_create(
        MetricSample(job=job, stage="", name="x", value=i, at=ago(now, hours=100 + i))
        for i in range(10)
    )
    rows = MetricSample.objects.filter(at__lt=ago(now, hours=48))
    assert retention.delete_in_batches(rows, 4, time.monotonic() - 1) == 0  # past the deadline
    assert MetricSample.objects.count() == 10
    assert retention.delete_in_batches(rows, 4, time.monotonic() + 60) == 10
    stopped = retention.purge_old_records(
        None, retention.Retention(max_seconds=0, batch_rows=1), now=now
    )
    assert stopped["finished"] is False


def test_the_beat_task_is_scheduled_and_registered(now):
    import workers.tasks  # noqa: F401  (registers the tasks with the Celery app)

    assert PERIODIC_TASKS["backstop: purge old records"] == (tasks.PURGE_OLD_RECORDS.name, 3600)
    ensure_periodic_tasks()
    from django_celery_beat.models import PeriodicTask

    assert PeriodicTask.objects.get(name="backstop: purge old records").task == (
        tasks.PURGE_OLD_RECORDS.name
    )
    for name in (tasks.PURGE_OLD_RECORDS.name, tasks.PURGE_OLD_METRICS.name):
        assert name in current_app.tasks


def test_the_task_purges_with_the_settings(now, settings, redis):
    from workers.tasks import purge_old_metrics, purge_old_records

    settings.METRIC_RETENTION_HOURS = 2
    job = make_job(Job.Status.RUNNING)
    old = MetricFactory(job=job, stage="", at=timezone.now() - timedelta(hours=3))
    new = MetricFactory(job=job, stage="", at=timezone.now() - timedelta(hours=1))
    result = purge_old_records()
    assert result["metrics"] == 1 and result["finished"]
    assert list(MetricSample.objects.values_list("pk", flat=True)) == [new.pk]
    assert old.pk != new.pk
    assert purge_old_metrics(hours=0.5)["metrics"] == 1


def test_old_resolved_alerts_and_ended_deliveries_go_open_and_pending_ones_stay(monkeypatch):
    monkeypatch.setattr("console.services.alert_routing.enqueue", lambda ids: None)
    now = timezone.now()
    job = make_job(Job.Status.RUNNING)
    AlertRoute.objects.create(name="hook", channel="webhook", target="http://127.0.0.1:9/")
    old = ago(now, days=31)
    raise_alert(f"job-failed:{job.key}", "job-failed", job=job, summary="old", now=old)
    clear_alert(f"job-failed:{job.key}", now=old)
    still_open = raise_alert(f"restarts:{job.key}", "restarts", job=job, summary="s", now=old)
    AlertDelivery.objects.filter(alert=still_open).update(status="delivered")
    pending = raise_alert(f"kafka-lag:{job.key}", "kafka-lag", job=job, summary="l", now=old)
    purged = retention.purge_old_records(None, POLICY, now=now)
    # The resolved alert (its trigger and resolve with it), and the open one's delivered trigger.
    assert purged["alerts"] == 1 + 1
    assert set(Alert.objects.values_list("key", flat=True)) == {still_open.key, pending.key}
    assert list(AlertDelivery.objects.values_list("alert__key", "status")) == [
        (pending.key, "pending")
    ]
