"""The console's view of a job's Kafka input and output: the job page's Kafka panel, the
overview's lag column.

The lag entries and stats fields are written into the real Redis the way the data plane writes
them (spark_runtime/kafka_source.py); the replicas and metric samples are database rows. What the
page must show is computed here by hand."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.dash.job import callbacks as job_page
from console.dash.job import figures
from console.dash.overview import callbacks as overview
from console.models import Job, MetricSample, Replica
from console.redis import redis_client
from console.roles import VIEWER
from console.services.kafka_status import PartitionLag, ReplicaLag
from spark_runtime import keys as data_keys
from tests.dash.components import text_of
from tests.dash.test_query_counts import MAX_QUERIES
from tests.factories import NodeFactory, ReplicaFactory, make_job

pytestmark = pytest.mark.django_db

CAUSE = "broker 127.0.0.1:9092 does not answer: KafkaError{code=_TRANSPORT}"


def find(component, component_id: str):
    """The component with `component_id` inside a Dash tree, or None."""
    if isinstance(component, list | tuple):
        for child in component:
            hit = find(child, component_id)
            if hit is not None:
                return hit
        return None
    if component is None or isinstance(component, str | int | float):
        return None
    if getattr(component, "id", None) == component_id:
        return component
    return find(getattr(component, "children", None), component_id)


def table_cells(component, table_id: str) -> tuple[list[str], list[list[str]]]:
    """(header texts, body rows as cell texts) of the table `table_id`."""
    head, body = find(component, table_id).children
    columns = [text_of(th) for th in head.children.children]
    return columns, [[text_of(td) for td in tr.children] for tr in body.children]


def lag_entry(stage: str, partitions: dict[int, tuple[int, int]], at: float) -> str:
    """A lag entry as KafkaPlanReader._publish_lag writes it."""
    return json.dumps(
        {
            "stage": stage,
            "topic": "clicks",
            "at": at,
            "partitions": {str(p): [read, end] for p, (read, end) in partitions.items()},
        }
    )


@pytest.fixture
def kafka_job():
    """A running job reading topic `clicks` (partitions 0 and 1) and writing `counts`: split's
    primary split-1 is 800 + 400 records behind; its standby and an ended primary are further
    behind and do not count."""
    node = NodeFactory(name="kafka-node")
    job = make_job(Job.Status.RUNNING, name="clicks-wc")
    Job.objects.filter(pk=job.pk).update(
        source={"kind": "kafka", "topic": "clicks", "starting_offsets": "latest",
                "accept_loss": True},
        sink={"kind": "kafka", "topic": "counts"},
    )  # fmt: skip
    job.refresh_from_db()
    for local, stage, role, state in (
        ("split-0", "split", Replica.Role.PRIMARY, Replica.State.FAILED),
        ("split-1", "split", Replica.Role.PRIMARY, Replica.State.RUNNING),
        ("split-2", "split", Replica.Role.STANDBY, Replica.State.RUNNING),
        ("count-1", "count", Replica.Role.PRIMARY, Replica.State.RUNNING),
    ):
        ReplicaFactory(job=job, node=node, stage=stage, role=role, state=state,
                       replica_id=Replica.full_id(job.key, local))  # fmt: skip
    now = time.time()
    conn = redis_client()
    conn.hset(
        data_keys.kafka_lag(job.key),
        mapping={
            "split-0": lag_entry("split", {0: (0, 500), 1: (0, 200)}, now - 60),
            "split-1": lag_entry("split", {0: (100, 900), 1: (50, 450)}, now - 3),
            "split-2": lag_entry("split", {0: (0, 900), 1: (0, 450)}, now - 1),
        },
    )
    conn.hset(
        data_keys.stats(job.key),
        mapping={"kafka:source": CAUSE, "kafka:skipped": "40", "dead:split": "3",
                 "dead:count": "1"},
    )  # fmt: skip
    at = timezone.now()
    MetricSample.objects.bulk_create(
        [
            MetricSample(job=job, stage="split", name="input_rate_eps", value=110.0,
                         at=at - timedelta(seconds=10)),
            MetricSample(job=job, stage="split", name="input_rate_eps", value=120.0, at=at),
            MetricSample(job=job, stage="", name="input_rate_eps", value=999.0, at=at),
            MetricSample(job=job, stage="", name="throughput_eps", value=95.0, at=at),
        ]
    )  # fmt: skip
    yield job
    data_keys.delete_job_keys(conn, job.key)


# The job page's outputs after the Kafka panel: an app's card (console/dash/job/app_queries).
APP_OUTPUTS = 4


def refresh_job(job, user):
    """The job page's outputs up to its Kafka panel (hidden, panel) included."""
    return job_page.refresh(1, 300, f"/console/jobs/{job.pk}/", user=user)[:-APP_OUTPUTS]


def test_the_job_page_shows_topics_rates_lag_of_the_primary_and_the_cause(kafka_job, users):
    *_, hidden, panel = refresh_job(kafka_job, users[VIEWER])
    assert hidden is False
    assert "The Kafka source is not reading:" in text_of(find(panel, "kafka-warning"))
    assert text_of(find(panel, "kafka-cause")) == CAUSE
    shown = {
        field: text_of(find(panel, field))
        for field in ("kafka-source-topic", "kafka-starting", "kafka-event-time",
                      "kafka-accept-loss", "kafka-sink-topic", "kafka-in", "kafka-out",
                      "kafka-total", "kafka-dead", "kafka-skipped")
    }  # fmt: skip
    assert shown == {
        "kafka-source-topic": "clicks",
        "kafka-starting": "latest",
        "kafka-event-time": "the record's timestamp",
        "kafka-accept-loss": "skipped and counted (accept_loss)",
        "kafka-sink-topic": "counts",
        "kafka-in": "120",  # the newest input rate of split, the stage reading the topic
        "kafka-out": "95",  # the job's newest throughput
        "kafka-total": f"{(900 - 100) + (450 - 50):,}",
        "kafka-dead": "4 (count 1, split 3)",
        "kafka-skipped": "40",
    }
    columns, rows = table_cells(panel, "kafka-lag")
    assert columns == ["Stage", "Primary", "Partition", "Read offset", "End offset", "Lag",
                       "Published"]  # fmt: skip
    assert [row[:6] for row in rows] == [
        ["split", "split-1", "0", "100", "900", "800"],
        ["split", "split-1", "1", "50", "450", "400"],
        ["total", "", "", "", "", "1,200"],
    ]
    assert rows[0][6] in ("3 s ago", "4 s ago")


def test_the_warning_goes_when_the_source_reads_again(kafka_job, users):
    redis_client().hdel(data_keys.stats(kafka_job.key), "kafka:source")
    *_, panel = refresh_job(kafka_job, users[VIEWER])
    assert find(panel, "kafka-warning") is None
    assert text_of(find(panel, "kafka-total")) == "1,200"


def test_a_job_without_kafka_has_no_kafka_panel(users):
    job = make_job(Job.Status.RUNNING, name="plain")
    *_, hidden, panel = refresh_job(job, users[VIEWER])
    assert hidden is True and panel is None


def test_the_overview_shows_the_lag_of_kafka_jobs_only(kafka_job, users):
    make_job(Job.Status.RUNNING, name="plain")
    _, jobs, *_ = overview.refresh(1, 300, user=users[VIEWER])
    columns, rows = table_cells(jobs, "jobs")
    lag = columns.index("Kafka lag")
    by_name = {row[0]: row[lag] for row in rows}
    assert by_name == {"clicks-wc": "1,200", "plain": ""}
    # No primary has published yet (none runs): a dash, not a blank.
    Replica.objects.filter(job=kafka_job).update(state=Replica.State.STOPPED)
    _, jobs, *_ = overview.refresh(1, 300, user=users[VIEWER])
    columns, rows = table_cells(jobs, "jobs")
    assert {row[0]: row[lag] for row in rows} == {"clicks-wc": "—", "plain": ""}


def test_a_kafka_job_costs_one_query_more_on_each_page(kafka_job, users):
    """The job page reads the rate into the stage reading the topic; the overview reads the
    live primaries of the Kafka jobs it lists: one query each, whatever the number of jobs."""
    viewer = users[VIEWER]
    refresh_job(kafka_job, viewer)  # warm up
    with CaptureQueriesContext(connection) as queries:
        refresh_job(kafka_job, viewer)
    assert len(queries) <= MAX_QUERIES["job"] + 1
    for n in range(3):
        job = make_job(Job.Status.RUNNING, name=f"more-{n}")
        Job.objects.filter(pk=job.pk).update(source={"kind": "kafka", "topic": "clicks"})
    overview.refresh(1, 300, user=viewer)
    with CaptureQueriesContext(connection) as queries:
        overview.refresh(1, 300, user=viewer)
    assert len(queries) <= MAX_QUERIES["overview"] + 1


# --- the builders alone -------------------------------------------------------------------------


def test_lag_rows_give_each_partition_and_the_total():
    lags = [
        ReplicaLag("split-1", "split", "clicks", 100.0,
                   (PartitionLag(0, 10, 25), PartitionLag(1, 7, 7))),
        ReplicaLag("enrich-1", "enrich", "clicks", 98.0, (PartitionLag(0, 5, 1005),)),
    ]  # fmt: skip
    rows = figures.kafka_lag_rows(lags, now=102.4)
    assert [[text_of(cell) for cell in row] for row in rows] == [
        ["split", "split-1", "0", "10", "25", "15", "2 s ago"],
        ["split", "split-1", "1", "7", "7", "0", "2 s ago"],
        ["enrich", "enrich-1", "0", "5", "1,005", "1,000", "4 s ago"],
        ["total", "", "", "", "", "1,015", ""],
    ]
    assert figures.kafka_lag_rows([], now=0.0) == []


def test_the_panel_of_a_job_writing_kafka_only_has_no_lag_table():
    view = {"source": {}, "sink": {"kind": "kafka", "topic": "counts"}, "lags": [],
            "total": None, "cause": "", "skipped": 0, "dead": {}, "input_eps": 50.0,
            "now": 0.0}  # fmt: skip
    panel = figures.kafka_panel(view, output_eps=48.6)
    assert find(panel, "kafka-lag") is None and find(panel, "kafka-warning") is None
    assert text_of(find(panel, "kafka-source-topic")) == "— (the job's own input stream)"
    assert text_of(find(panel, "kafka-sink-topic")) == "counts"
    assert text_of(find(panel, "kafka-out")) == "49"
    assert text_of(find(panel, "kafka-dead")) == "0"
    assert figures.kafka_panel(None) is None
    # A source with nothing published yet says so instead of an empty table.
    view = {**view, "source": {"kind": "kafka", "topic": "clicks"}}
    text = text_of(figures.kafka_panel(view))
    assert "No lag published yet by a primary reading clicks." in text
    assert "fail the batch (no accept_loss)" in text and "earliest" in text
