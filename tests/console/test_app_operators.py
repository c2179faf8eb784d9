"""An app job's operators and queries as its stage reports them (console/services/
app_operators.py): the stateful operators published for its queries become the job's
operators in the real policy cycle (rows, the app's stage, scored by the policy), once; the API
and the job page show each query's newest batch, its operators and the app's output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from console.models import ControlDecision, Job, MetricSample, Operator
from console.roles import ADMIN
from console.services import controller
from console.services.control import cycle, observe
from console.services.jobs import create_job
from console.services.topologies import register_app
from infra import keys as control_keys
from spark_runtime import keys
from spark_runtime.app_output import OutputTail
from spark_runtime.app_plan import stateful_operators
from spark_runtime.progress import ProgressRecord, publish_progress, source_summary
from tests.agent_edge import publish_usage
from tests.factories import NodeFactory, UserFactory

pytestmark = [pytest.mark.django_db]

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "apps"
PLANS = Path(__file__).resolve().parents[1] / "spark_runtime" / "plans"
NODES = ["ao-node-1", "ao-node-2"]


@pytest.fixture
def app_job(tmp_path, monkeypatch, redis_conn):
    """A registered app's job, launched by the real controller on two nodes."""
    directory = tmp_path / "jobs"
    shutil.copytree(EXAMPLES, directory / "apps")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    version, _ = register_app("apps/spend_totals.py", "spend")
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(redis_conn, NODES)
    job = create_job(
        name="spend", topology=version.ident, strategy="restart-all", params={}, args=["--in", "x"]
    )
    controller.launch_job(job)
    job.refresh_from_db()
    yield job
    keys.delete_job_keys(redis_conn, job.key)


def publish_plans(client, job: Job) -> None:
    """What the app's stage publishes for two queries (spark_runtime.app_stage.QueryPlans), from
    plans real queries printed."""
    for query, plan in (("totals", "aggregate"), ("large", "deduplicate")):
        found = stateful_operators((PLANS / f"{plan}.txt").read_text(), query)
        client.hset(keys.app_operators(job.key), query, json.dumps([f.to_dict() for f in found]))


def test_found_operators_become_the_jobs_scored_operators_once(app_job, redis_conn):
    job = app_job
    launched_at = ControlDecision.objects.filter(job=job).latest("at").at
    supervisor = observe.load_supervisor(redis_conn, job)
    cycle.policy_cycle(job, supervisor, redis_conn)
    assert list(job.operators.values_list("name", flat=True)) == ["app"]  # nothing found yet

    publish_plans(redis_conn, job)
    cycle.policy_cycle(job, supervisor, redis_conn)
    rows = {op.name: op for op in job.operators.all()}
    assert set(rows) == {"app", "large:deduplicate", "totals:aggregate"}
    (stage,) = supervisor.stage_operators
    assert supervisor.stage_operators[stage] == ("app", "large:deduplicate", "totals:aggregate")
    found = rows["totals:aggregate"]
    assert (found.kind, found.stage, found.upstream) == ("aggregate", stage, ["app"])
    assert sorted(rows["app"].downstream) == ["large:deduplicate", "totals:aggregate"]
    # Scored by the policy like a declared operator: S of an aggregation, P stored.
    assert found.type_score == 0.5 and found.priority > 0
    assert MetricSample.objects.filter(job=job, stage="totals:aggregate", name="priority")

    cycle.policy_cycle(job, supervisor, redis_conn)  # again: nothing new
    assert Operator.objects.filter(job=job).count() == 3
    # The app's own code sets its queries' intervals: the cycles send or log none for them.
    intervals = ControlDecision.objects.filter(job=job, kind=ControlDecision.Kind.SET_INTERVAL)
    assert intervals.filter(at__gt=launched_at).count() == 0
    assert not redis_conn.exists(control_keys.interval_requests(job.key))
    assert supervisor.stage_operators[stage] == ("app", "large:deduplicate", "totals:aggregate")


def progress(query: str, batch: int, rate: float, sources) -> ProgressRecord:
    spark_progress = SimpleNamespace(
        batchId=batch,
        numInputRows=10,
        inputRowsPerSecond=rate,
        processedRowsPerSecond=rate * 2,
        batchDuration=120,
        stateOperators=[SimpleNamespace(numRowsTotal=7, memoryUsedBytes=100)],
        eventTime={"watermark": "2026-11-28T10:00:05.000Z"},
        sources=sources,
    )
    return ProgressRecord.of_batch(
        spark_progress,
        replica="job-1",
        stage="job",
        role="primary",
        node="n",
        query=query,
        segment="0",
        rows_out=10,
        written=10,
        final=True,
        buffered=0,
    )


def test_the_api_and_the_page_show_each_querys_newest_batch_and_the_output(app_job, redis_conn):
    job = app_job
    publish_plans(redis_conn, job)
    file_source = SimpleNamespace(
        description="FileStreamSource[file:/in]",
        startOffset='{"logOffset":1}',
        endOffset='{"logOffset":2}',
        latestOffset='{"logOffset":5}',
        metrics={},
    )
    for batch, rate in ((1, 4.0), (2, 6.0)):
        publish_progress(redis_conn, job.key, progress("totals", batch, rate, [file_source]))
    publish_progress(redis_conn, job.key, progress("large", 9, 1.0, []))
    tail = OutputTail(redis_conn, job.key, "job-1")
    tail.add("stdout", "loaded 3 files")
    tail.add("stderr", "Traceback (most recent call last):")
    tail.flush()

    admin = APIClient()
    admin.force_authenticate(UserFactory(username="ada", role=ADMIN))
    response = admin.get(f"/api/jobs/{job.pk}/")
    assert response.status_code == 200, response.content
    app = response.json()["app"]
    totals, large = sorted(app["queries"], key=lambda q: q["query"], reverse=True)
    assert (totals["query"], totals["batch"], totals["input_rate"]) == ("totals", 2, 6.0)
    assert (totals["processed_rate"], totals["batch_ms"], totals["state_rows"]) == (12.0, 120, 7)
    assert totals["watermark"] == "2026-11-28T10:00:05.000Z"
    assert totals["lag"] == 3  # latest 5 less end 2
    assert totals["sources"][0]["end"] == json.dumps({"logOffset": 2})
    assert [op["name"] for op in totals["operators"]] == ["totals:aggregate"]
    assert (large["lag"], [op["kind"] for op in large["operators"]]) == (None, ["aggregate"])
    assert [(line["stream"], line["line"]) for line in app["output"]] == [
        ("stdout", "loaded 3 files"),
        ("stderr", "Traceback (most recent call last):"),
    ]
    assert source_summary([file_source]) == progress("x", 1, 1.0, [file_source]).sources

    # A job that is not an app has no `app`.
    other = create_job(name="wc", topology="wordcount", strategy="restart-all", params={})
    assert "app" not in admin.get(f"/api/jobs/{other.pk}/").json()
