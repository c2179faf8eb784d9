"""Console queries against the database: bucketing, latest values, episodes, decisions."""

import time
from datetime import UTC, datetime, timedelta

import pytest

from console.dash import data
from console.dash.recoveries import figures as recovery_figures
from console.models import ControlDecision, Job, MetricSample, Replica
from tests.factories import (
    EpisodeFactory,
    FaultFactory,
    MetricFactory,
    NodeFactory,
    ReplicaFactory,
    make_job,
)

pytestmark = pytest.mark.django_db

END = datetime(2026, 1, 2, 0, 0, tzinfo=UTC)


def test_bucket_width_keeps_the_number_of_buckets_bounded():
    assert data.bucket_width(300, 600) == 1
    assert data.bucket_width(86_400, 1000) == 87
    assert data.bucket_width(3600, 1000) == 4


def test_buckets_average_the_samples_they_hold():
    job = make_job(Job.Status.RUNNING)
    start = END - timedelta(seconds=40)
    MetricSample.objects.bulk_create(
        MetricSample(at=start + timedelta(seconds=i + 1), job=job, name="throughput_eps", value=i)
        for i in range(40)
    )
    frame = data.metric_series(
        ("throughput_eps",), 40, max_points=4, job_ids=[job.pk], stage="", end=END
    )
    # 10 s buckets aligned on the epoch; samples at :21..:29 hold 0..8, :30..:39 hold 9..18, ...
    # and the last one (00:00:00) starts a bucket of its own.
    assert list(frame["value"]) == [4.0, 13.5, 23.5, 33.5, 39.0]
    assert frame["at"].is_monotonic_increasing
    assert frame["at"].iloc[0] == start


def test_a_day_at_one_second_comes_back_as_about_a_thousand_points(capsys):
    job = make_job(Job.Status.RUNNING)
    start = END - timedelta(days=1)
    MetricSample.objects.bulk_create(
        (
            MetricSample(
                at=start + timedelta(seconds=i + 1), job=job, name="throughput_eps", value=i % 100
            )
            for i in range(86_400)
        ),
        batch_size=5000,
    )
    began = time.perf_counter()
    frame = data.metric_series(
        ("throughput_eps",), 86_400, max_points=1000, job_ids=[job.pk], stage="", end=END
    )
    jobs = [{"id": job.pk, "name": job.name, "strategy": job.strategy}]
    recovery_figures.timeline_figure(jobs, frame, [], [], now=END)
    elapsed = time.perf_counter() - began
    with capsys.disabled():
        print(f"\n  86,400 samples -> {len(frame)} points: query + figure {elapsed * 1000:.0f} ms")
    assert 900 <= len(frame) <= 1001
    assert frame["value"].between(0, 99).all()


def test_series_keep_job_level_and_operator_rows_apart():
    job = make_job(Job.Status.RUNNING)
    MetricFactory(job=job, stage="", name="throughput_eps", value=10.0, at=END)
    MetricFactory(job=job, stage="count", name="throughput_eps", value=99.0, at=END)
    MetricFactory(job=job, stage="count", name="priority", value=0.6, at=END)
    job_level = data.metric_series(
        ("throughput_eps",), 60, max_points=60, job_ids=[job.pk], stage="", end=END
    )
    assert list(job_level["value"]) == [10.0]
    history = data.operator_history(job.pk, 60, 60, end=END)
    assert list(zip(history["stage"], history["name"], strict=True)) == [("count", "priority")]


def test_cluster_utilisation_is_sum_used_over_sum_total():
    big = NodeFactory(name="big", cpu_total=6.0, mem_total_mb=6000.0)
    small = NodeFactory(name="small", cpu_total=2.0, mem_total_mb=2000.0)
    for node, cpu, mem in ((big, 0.5, 0.1), (small, 1.0, 0.5)):
        MetricFactory(node=node, name="cpu_util", value=cpu, at=END)
        MetricFactory(node=node, name="mem_util", value=mem, at=END)
    frame = data.cluster_utilisation(60, 60, end=END)
    assert len(frame) == 1
    assert frame["cpu"].iloc[0] == pytest.approx((3.0 + 2.0) / 8.0)
    assert frame["mem"].iloc[0] == pytest.approx((600 + 1000) / 8000)


def test_job_rows_show_the_newest_numbers_and_episode_counts():
    job = make_job(Job.Status.RUNNING, name="wc")
    now = datetime.now(UTC)
    MetricFactory(
        job=job, stage="", name="throughput_eps", value=100.0, at=now - timedelta(seconds=5)
    )
    MetricFactory(job=job, stage="", name="throughput_eps", value=250.0, at=now)
    MetricFactory(job=job, stage="count", name="throughput_eps", value=999.0, at=now)
    EpisodeFactory(job=job, detected_at=now - timedelta(minutes=5))
    EpisodeFactory(
        job=job, detected_at=now - timedelta(hours=3), recovered_at=now - timedelta(hours=3)
    )
    (row,) = data.job_rows(now=now)
    assert row["throughput_eps"] == 250.0
    assert row["latency_p99_ms"] is None
    assert row["open_episodes"] == 1
    assert row["recent_episodes"] == 1


def test_node_rows_list_live_primaries_and_standbys():
    node = NodeFactory(name="n1")
    job = make_job(Job.Status.RUNNING, name="wc")
    ReplicaFactory(job=job, node=node, stage="count", role=Replica.Role.PRIMARY, nice=-5)
    ReplicaFactory(job=job, node=node, stage="split", role=Replica.Role.STANDBY, nice=5,
                   batch_every_s=3.0)  # fmt: skip
    ReplicaFactory(job=job, node=node, stage="sink", state=Replica.State.FAILED)
    MetricFactory(node=node, name="q_score", value=1.25)
    (row,) = data.node_rows()
    assert [(r["stage"], r["nice"]) for r in row["primaries"]] == [("count", -5)]
    assert [(r["stage"], r["nice"], r["batch_every_s"]) for r in row["standbys"]] == [
        ("split", 5, 3.0)
    ]
    assert row["q_score"] == 1.25
    assert row["cpu_util"] is None


def test_standby_rows_carry_the_primary_node_and_the_policy_verdict():
    n1, n2 = NodeFactory(name="n1"), NodeFactory(name="n2")
    job = make_job(Job.Status.RUNNING, name="wc")
    ReplicaFactory(job=job, node=n1, stage="count", role=Replica.Role.PRIMARY)
    verdict = {
        "operator": "count",
        "node": "n2",
        "rule": "kept",
        "reason": "kept: started 20 s ago; a standby runs 120 s on its node before a move is ...",
        "reserve": "kept after this cycle: cpu 58% / mem 75% free vs reserve 20%",
        "at": "2026-01-01T12:00:00+00:00",
    }
    ReplicaFactory(job=job, node=n2, stage="count", role=Replica.Role.STANDBY, placement=verdict)
    ReplicaFactory(job=job, node=n1, stage="old", role=Replica.Role.STANDBY,
                   state=Replica.State.STOPPED)  # fmt: skip
    (row,) = data.standby_rows()
    assert (row["stage"], row["node"], row["primary_node"]) == ("count", "n2", "n1")
    assert (row["rule"], row["reason"], row["reserve"]) == (
        "kept",
        verdict["reason"],
        verdict["reserve"],
    )
    assert row["judged_at"] == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_strategy_comparison_summarises_finished_episodes_per_strategy():
    """Downtime is the mean, lost the sum and peak p99 the worst episode's (a maximum, as in the
    reports: console.services.reports)."""
    job = make_job(Job.Status.RUNNING)
    now = datetime.now(UTC)
    for downtime, peak in ((2.0, 1200.0), (4.0, 3000.0)):
        EpisodeFactory(
            job=job,
            strategy="adaptive",
            recovered_at=now,
            downtime_s=downtime,
            peak_p99_ms=peak,
            lost=1,
        )
    EpisodeFactory(
        job=job, strategy="restart-all", recovered_at=now, downtime_s=20.0, peak_p99_ms=9000.0
    )
    EpisodeFactory(
        job=job, strategy="restart-all", recovered_at=now, downtime_s=30.0, peak_p99_ms=None
    )
    # Still open: left out (its peak would be the worst).
    EpisodeFactory(job=job, strategy="restart-all", downtime_s=500.0, peak_p99_ms=50_000.0)
    rows = {r["strategy"]: r for r in data.strategy_comparison()}
    assert rows["adaptive"]["episodes"] == 2
    assert rows["adaptive"]["downtime_s"] == pytest.approx(3.0)  # (2 + 4) / 2
    assert rows["adaptive"]["lost"] == 2
    assert rows["adaptive"]["peak_p99_ms"] == pytest.approx(3000.0)  # max(1200, 3000), not 2100
    assert rows["restart-all"]["episodes"] == 2
    assert rows["restart-all"]["downtime_s"] == pytest.approx(25.0)  # (20 + 30) / 2
    # An episode without a peak does not count: max(9000), not 4500.
    assert rows["restart-all"]["peak_p99_ms"] == pytest.approx(9000.0)


def test_episode_rows_name_the_fault_that_caused_them():
    job = make_job(Job.Status.RUNNING, name="wc")
    node = NodeFactory(name="n9")
    fault = FaultFactory(job=job, kind="kill-node", target_operator="", target_node=node)
    EpisodeFactory(job=job, fault=fault)
    (row,) = data.episode_rows(job_ids=[job.pk])
    assert (row["fault_kind"], row["fault_target"]) == ("kill-node", "n9")


def test_recent_decisions_come_newest_first_with_reasons():
    job = make_job(Job.Status.RUNNING)
    now = datetime.now(UTC)
    ControlDecision.objects.create(
        job=job,
        at=now - timedelta(seconds=10),
        kind="add-standby",
        stage="count",
        node="n2",
        reason="P above threshold",
    )
    ControlDecision.objects.create(
        job=job, at=now, kind="set-interval", stage="split", reason="no fault: 5 s -> 6 s"
    )
    rows = data.recent_decisions(job.pk, limit=10)
    assert [r["kind"] for r in rows] == ["set-interval", "add-standby"]
    assert rows[1]["node"] == "n2"
    assert rows[1]["reason"] == "P above threshold"
    assert data.recent_decisions(job.pk, limit=1)[0]["kind"] == "set-interval"


def test_failure_history_pairs_each_failure_with_the_controller_response():
    job = make_job(Job.Status.RUNNING)
    now = datetime.now(UTC)
    ControlDecision.objects.create(
        job=job,
        at=now,
        kind="failure",
        stage="count",
        node="n1",
        replica_id="r-1",
        reason="r-1: ReplicaExited",
        detail={"error_tail": "Traceback\nKilled"},
    )
    ControlDecision.objects.create(
        job=job,
        at=now,
        kind="promote",
        stage="count",
        node="n2",
        replica_id="r-1",
        reason="standby promoted",
    )
    ControlDecision.objects.create(
        job=job, at=now + timedelta(seconds=30), kind="add-standby", stage="count", reason="later"
    )
    (row,) = data.failure_history(job.pk)
    assert row["replica_id"] == "r-1"
    assert row["node"] == "n1"
    assert row["error_tail"] == "Traceback\nKilled"
    assert row["response"] == "promote: standby promoted"
