"""/metrics: the Prometheus endpoint, scraped like Prometheus would, its values checked against
the REST API and against the stored rows computed here in plain Python."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from console.models import FaultInjection, MetricSample, RecoveryEpisode
from console.redis import redis_client
from console.roles import VIEWER
from console.services.prometheus import DURATION_BUCKETS_S
from infra import keys as control_keys
from infra.leases import heartbeat
from spark_runtime import keys as data_keys
from spark_runtime.command_fence import report_refusal
from tests.dash.seed import seed_console

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-scrape-token"


def scrape(client) -> dict[str, list]:
    """Metric family name -> its samples (name, labels, value)."""
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    families = text_string_to_metric_families(response.content.decode())
    return {f.name: f.samples for f in families}


def values(samples, **labels) -> list[float]:
    return [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]


def newest(job, name: str) -> float:
    rows = MetricSample.objects.filter(job=job, stage="", name=name).values_list("at", "value")
    return max(rows)[1]


@pytest.fixture
def seeded(settings):
    settings.METRICS_TOKEN = TOKEN
    return seed_console(minutes=5)


def test_the_endpoint_is_off_without_a_token_and_refuses_wrong_ones(client, settings):
    settings.METRICS_TOKEN = ""
    response = client.get("/metrics")
    assert response.status_code == 404 and "METRICS_TOKEN" in response.json()["error"]["detail"]
    settings.METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    post = client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert post.status_code == 405


def test_jobs_operators_and_replicas_match_the_api(client, seeded, api_as):
    metrics = scrape(client)
    api = api_as(VIEWER)
    for job in (seeded.adaptive, seeded.baseline):
        detail = api.get(f"/api/jobs/{job.pk}/").json()
        job_id = str(job.pk)
        info = [s.labels for s in metrics["backstop_job_info"] if s.labels["job_id"] == job_id]
        assert info == [
            {
                "job_id": job_id,
                "name": detail["name"],
                "topology": detail["topology"],
                "strategy": detail["strategy"],
                "status": detail["status"],
            }
        ]
        assert values(metrics["backstop_job_running"], job_id=job_id) == [1.0]
        for op in detail["operators"]:
            labels = {"job_id": job_id, "operator": op["name"]}
            assert values(metrics["backstop_operator_priority"], **labels) == [op["priority"]]
            active = 1.0 if op["mode"] == "active" else 0.0
            assert values(metrics["backstop_operator_active"], **labels) == [active]
            interval = values(metrics["backstop_operator_checkpoint_interval_seconds"], **labels)
            assert interval == [op["checkpoint_interval_s"]]
        replicas = [
            s.labels for s in metrics["backstop_replica_info"] if s.labels["job_id"] == job_id
        ]
        assert sorted((r["stage"], r["role"], r["node"]) for r in replicas) == sorted(
            (r["stage"], r["role"], r["node"]) for r in detail["replicas"]
        )
        throughput = values(metrics["backstop_job_throughput_events_per_second"], job_id=job_id)
        assert throughput == [pytest.approx(newest(job, "throughput_eps"))]
        p99 = values(
            metrics["backstop_job_event_time_latency_seconds"], job_id=job_id, quantile="0.99"
        )
        assert p99 == [pytest.approx(newest(job, "latency_p99_ms") / 1000)]
    assert values(metrics["backstop_node_up"], node="node-a") == [1.0]
    assert len(metrics["backstop_node_q_score"]) == 3


def test_fault_and_recovery_counters_and_histograms_count_the_stored_rows(client, seeded):
    metrics = scrape(client)
    for fault in FaultInjection.objects.all():
        counted = FaultInjection.objects.filter(kind=fault.kind, outcome=fault.outcome).count()
        samples = metrics["backstop_faults"]
        assert values(samples, kind=fault.kind, outcome=fault.outcome) == [counted]
        assert all(s.name == "backstop_faults_total" for s in samples)
    downtimes: dict[str, list[float]] = {}
    for strategy, downtime in RecoveryEpisode.objects.values_list("strategy", "downtime_s"):
        if downtime is not None:
            downtimes.setdefault(strategy, []).append(downtime)
    assert downtimes  # the seed has measured episodes
    histogram = metrics["backstop_recovery_downtime_seconds"]
    for strategy, observed in downtimes.items():
        for bound in DURATION_BUCKETS_S:
            bucket = [
                s.value
                for s in histogram
                if s.name.endswith("_bucket")
                and s.labels["strategy"] == strategy
                and float(s.labels["le"]) == bound
            ]
            assert bucket == [sum(1 for v in observed if v <= bound)]
        count = [
            s.value
            for s in histogram
            if s.name.endswith("_count") and s.labels["strategy"] == strategy
        ]
        assert count == [len(observed)]
        total = [
            s.value
            for s in histogram
            if s.name.endswith("_sum") and s.labels["strategy"] == strategy
        ]
        assert total == [pytest.approx(sum(observed))]


def test_controller_and_unsupervised_job_gauges(client, seeded):
    redis = redis_client()
    redis.delete(control_keys.controllers())
    for job in (seeded.adaptive, seeded.baseline):
        redis.delete(control_keys.controller_lease(job.key))
    metrics = scrape(client)
    assert values(metrics["backstop_controllers"]) == [0.0]
    assert values(metrics["backstop_jobs_unsupervised"]) == [2.0]  # two running jobs, no lease
    heartbeat(redis, "controller-a")
    heartbeat(redis, "controller-b")
    redis.zadd(control_keys.controllers(), {"controller-gone": time.time() - 10})
    redis.set(control_keys.controller_lease(seeded.adaptive.key), "controller-a", ex=30)
    try:
        metrics = scrape(client)
        assert values(metrics["backstop_controllers"]) == [2.0]
        assert values(metrics["backstop_jobs_unsupervised"]) == [1.0]
    finally:
        redis.delete(control_keys.controllers())
        redis.delete(control_keys.controller_lease(seeded.adaptive.key))


def test_refused_commands_are_counted(client, seeded):
    redis = redis_client()
    redis.delete(data_keys.refused_commands())
    try:
        assert values(scrape(client)["backstop_refused_commands"]) == [0.0]
        for replica in ("wc-1", "wc-2"):
            report_refusal(redis, seeded.adaptive.key, "agent n-1", f"start {replica}",
                           "ctl-a#1", "the job's lease is now 'ctl-b#2'")  # fmt: skip
        assert values(scrape(client)["backstop_refused_commands"]) == [2.0]
    finally:
        redis.delete(data_keys.refused_commands())
