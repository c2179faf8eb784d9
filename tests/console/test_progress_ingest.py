"""Progress records published to a real Redis become MetricSample rows (services.metrics)."""

import pytest

from console.models import MetricSample
from console.services.metrics import ingest_job_progress
from spark_runtime import keys
from spark_runtime.progress import publish_progress
from tests.factories import make_job, progress_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(redis_conn):
    job = make_job()
    yield job
    keys.delete_job_keys(redis_conn, job.key)


def samples(job, stage):
    return dict(
        MetricSample.objects.filter(job=job, stage=stage).values_list("name", "value").order_by()
    )


def test_a_primary_final_batch_gives_stage_and_job_metrics(redis_conn, job):
    publish_progress(
        redis_conn,
        job.key,
        progress_record(
            at=1700000000.5, stage="count", processed_rate=80.0, input_rate=50.0, batch_ms=900,
            state_rows=12, state_memory_bytes=4096, written=3, input_rows=40,
            latency_p50=0.25, latency_p90=0.5, latency_p99=1.25,
        ),
    )  # fmt: skip
    assert ingest_job_progress(redis_conn, job) == 11
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


def test_standbys_are_skipped_and_a_record_is_ingested_once(redis_conn, job):
    publish_progress(
        redis_conn, job.key, progress_record(at=10.0, role="standby", processed_rate=9.0)
    )
    publish_progress(
        redis_conn,
        job.key,
        progress_record(at=11.0, stage="split", final=False, processed_rate=7.0),
    )
    # split (not final): stage metrics only; no rates unknown to Spark (None) are stored.
    assert ingest_job_progress(redis_conn, job) == 3
    assert samples(job, "split") == {
        "throughput_eps": 7.0,
        "state_rows": 0.0,
        "state_memory_bytes": 0.0,
    }
    assert ingest_job_progress(redis_conn, job) == 0


def test_the_batches_of_one_ingest_become_one_row_per_metric(redis_conn, job):
    """A policy cycle's worth of batches: rates and batch time averaged, state size the newest,
    p50 averaged, p90 and p99 the worst batch's (figures worked out by hand)."""
    for at, rate, batch_ms, rows, p50, p99 in (
        (100.0, 40.0, 800, 10, 0.2, 1.0),
        (100.5, 60.0, 1000, 14, 0.4, 3.0),
        (101.0, 80.0, 600, 12, 0.3, 2.0),
    ):
        publish_progress(
            redis_conn,
            job.key,
            progress_record(
                at=at, stage="count", processed_rate=rate, input_rate=50.0, batch_ms=batch_ms,
                state_rows=rows, state_memory_bytes=1024, latency_p50=p50, latency_p90=p50,
                latency_p99=p99,
            ),
        )  # fmt: skip
    assert ingest_job_progress(redis_conn, job) == 11  # 5 stage rows + 6 job rows, not 33
    assert samples(job, "count") == {
        "throughput_eps": 60.0,
        "input_rate_eps": 50.0,
        "batch_duration_ms": 800.0,
        "state_rows": 12.0,  # the newest batch's
        "state_memory_bytes": 1024.0,
    }
    job_level = samples(job, "")
    assert job_level["latency_p50_ms"] == pytest.approx(300.0)
    assert job_level["latency_p90_ms"] == pytest.approx(400.0)
    assert job_level["latency_p99_ms"] == pytest.approx(3000.0)
    dated = MetricSample.objects.filter(job=job, stage="count", name="state_rows").get().at
    assert dated.timestamp() == pytest.approx(101.0)
