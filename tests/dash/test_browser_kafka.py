"""The Kafka card of the job page and the overview's lag column in a real browser (the system
Chromium, as tests/dash/test_browser.py), on seeded rows and lag entries written into Redis the
way the data plane writes them; the job page's shot goes to docs/screenshots/job-kafka.png."""

from __future__ import annotations

import json
import time

import pytest
from django.utils import timezone

from console.models import Job, MetricSample, Replica
from console.redis import redis_client
from spark_runtime import keys as data_keys
from tests.dash.seed import seed_console
from tests.dash.test_browser import (  # noqa: F401 (fixtures)
    LOAD_MS,
    _log_in,
    _shoot,
    browser,
    console_users,
    pytestmark,
)

CAUSE = "broker 127.0.0.1:9092 does not answer: KafkaError{code=_TRANSPORT,val=-195}"


@pytest.fixture
def kafka_job(transactional_db):
    """The seeded adaptive job, reading `clicks` (3 partitions) and writing `counts`, its split
    primary behind by 800 + 0 + 1,250 records, its broker not answering."""
    job = seed_console().adaptive
    Job.objects.filter(pk=job.pk).update(
        source={"kind": "kafka", "topic": "clicks", "starting_offsets": "earliest"},
        sink={"kind": "kafka", "topic": "counts"},
    )
    primary = Replica.objects.get(job=job, stage="split", role=Replica.Role.PRIMARY).replica_id
    # What the stage reading the topic took in per second, as the controller stores it.
    MetricSample.objects.create(
        job=job, stage="split", name="input_rate_eps", value=502.0, at=timezone.now()
    )
    conn = redis_client()
    entry = {
        "stage": "split",
        "topic": "clicks",
        "partitions": {"0": [41_200, 42_000], "1": [39_950, 39_950], "2": [40_100, 41_350]},
    }

    def publish():
        """The primary's entry, fresh (it publishes about every second)."""
        conn.hset(
            data_keys.kafka_lag(job.key),
            primary.split("/", 1)[-1],
            json.dumps({**entry, "at": time.time()}),
        )

    publish()
    conn.hset(
        data_keys.stats(job.key),
        mapping={"kafka:source": CAUSE, "dead:split": "3", "kafka:skipped": "0"},
    )
    yield Job.objects.get(pk=job.pk), publish
    data_keys.delete_job_keys(conn, job.key)


def test_the_kafka_card_and_the_lag_column(live_server, browser, kafka_job, console_users):  # noqa: F811
    from playwright.sync_api import expect

    kafka_job, publish = kafka_job
    page = _log_in(browser, live_server.url, "victor")
    lag = page.locator("#jobs tr", has_text=kafka_job.name).locator("td").nth(6)
    # The first refresh lands after Dash's bundles load, which takes longest on a busy machine.
    expect(lag).to_have_text("2,050", timeout=3 * LOAD_MS)
    publish()
    page.goto(f"{live_server.url}/console/jobs/{kafka_job.pk}/")
    expect(page.locator("#kafka-card")).to_be_visible()
    expect(page.locator("#kafka-cause")).to_have_text(CAUSE)
    expect(page.locator("#kafka-total")).to_have_text("2,050")
    expect(page.locator("#kafka-lag")).to_contain_text("1,250")
    expect(page.locator("#kafka-in")).to_have_text("502")
    expect(page.locator("#operators")).to_be_visible()
    _shoot(page, "job-kafka")
