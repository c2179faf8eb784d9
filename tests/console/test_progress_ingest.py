"""Progress records published to a real Redis become MetricSample rows (services.metrics)."""

import pytest

from console.models import MetricSample
from console.services.metrics import ingest_job_progress
from spark_runtime import keys
from spark_runtime.progress import publish_progress
from tests.factories import make_job, progress_record
from workers.redis_client import redis_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    conn = redis_client()
    yield conn
    conn.close()


@pytest.fixture
def job(client):
    job = make_job()
    yield job
    keys.delete_job_keys(client, job.key)


def samples(job, stage):
    return dict(
        MetricSample.objects.filter(job=job, stage=stage).values_list("name", "value").order_by()
    )


def test_a_primary_final_batch_gives_stage_and_job_metrics(client, job):
    publish_progress(
        client,
        job.key,
        progress_record(
            at=1700000000.5, stage="count", processed_rate=80.0, input_rate=50.0, batch_ms=900,
            state_rows=12, state_memory_bytes=4096, written=3, input_rows=40,
            latency_p50=0.25, latency_p90=0.5, latency_p99=1.25,
        ),
    )  # fmt: skip
    assert ingest_job_progress(client, job) == 11
    assert samples(job, "count") == {
        "throughput_eps": 80.0,
        "input_rate_eps": 50.0,
        "batch_duration_ms": 900.0,
        "state_rows": 12.0,
        "state_memory_bytes": 4096.0,
    }
    assert samples(job, "") == {
        "throughput_eps": 80.0,
        "input_rate_eps": 50.0,
        "batch_duration_ms": 900.0,
        "latency_p50_ms": 250.0,
        "latency_p90_ms": 500.0,
        "latency_p99_ms": 1250.0,
    }


def test_standbys_are_skipped_and_a_record_is_ingested_once(client, job):
    publish_progress(client, job.key, progress_record(at=10.0, role="standby", processed_rate=9.0))
    publish_progress(
        client, job.key, progress_record(at=11.0, stage="split", final=False, processed_rate=7.0)
    )
    # split (not final): stage metrics only; no rates unknown to Spark (None) are stored.
    assert ingest_job_progress(client, job) == 3
    assert samples(job, "split") == {
        "throughput_eps": 7.0,
        "state_rows": 0.0,
        "state_memory_bytes": 0.0,
    }
    assert ingest_job_progress(client, job) == 0
