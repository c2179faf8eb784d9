"""The tutorial of docs/JOBS.md end to end: the example job `activity`
(jobs/examples/clickstream.py, not part of spark_runtime/) registered through the API, started
under adaptive on the real controller and node agents, its stateful primary killed while input
flows; the results equal a plain-Python computation of the same input, and the job's own
reference agrees, as does the audit of its recovery episode."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from console.models import Job, RecoveryEpisode, Replica
from console.redis import redis_client
from console.roles import ADMIN, OPERATOR
from infra.launcher import wait_for
from spark_runtime import keys, user_plan
from spark_runtime.jobdef import resolve_topology
from tests.factories import UserFactory
from tests.integration.live import (
    api,
    assert_episodes_audited_exact,
    inject,
    wait_for_caught_up_standby,
)

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"
CLICKS = 3000  # 50 s of input at 60 clicks/s: the kill comes while input flows
RATE = 60


@pytest.fixture(autouse=True)
def jobs_dir(tmp_path, monkeypatch):
    """A jobs directory with the examples; set before the cluster starts, so every process of
    it (controller, agents, stages) imports job code from there."""
    directory = tmp_path / "jobs"
    shutil.copytree(EXAMPLES, directory / "examples")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    return directory


@pytest.fixture(autouse=True)
def people(transactional_db):
    UserFactory(username="opal", role=OPERATOR)
    return UserFactory(username="adam", role=ADMIN)


def iso(ms: int) -> str:
    seconds = dt.datetime.fromtimestamp(ms // 1000, tz=dt.UTC)
    return f"{seconds:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def expected_activity(client, job_key: str) -> dict:
    """Per user and 10-second window: clicks, total and longest dwell, from the input stream."""
    cells = defaultdict(lambda: {"clicks": 0, "dwell_ms": 0, "longest_ms": 0})
    for _, fields in client.xrange(keys.input_stream(job_key)):
        ts, dwell = int(fields["ts"]), int(fields["dwell_ms"])
        cell = cells[f"{fields['user']}|{iso(ts - ts % 10_000)}"]
        cell["clicks"] += 1
        cell["dwell_ms"] += dwell
        cell["longest_ms"] = max(cell["longest_ms"], dwell)
    return dict(cells)


def written(client, job_key: str) -> dict:
    return {k: json.loads(v) for k, v in client.hgetall(keys.results(job_key)).items()}


def test_a_registered_job_survives_the_kill_of_its_stateful_primary(cluster, people):
    admin = APIClient()
    admin.force_authenticate(people)
    registered = admin.post(
        "/api/topologies/", {"module": "examples.clickstream:activity"}, format="json"
    )
    assert registered.status_code == 201, registered.content

    response = api().post(
        "/api/jobs/",
        {"name": "it-activity", "topology": "activity", "strategy": "adaptive",
         "params": {"rate": RATE, "count": CLICKS, "seed": 11}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.topology == "activity@1"
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "job running")
    client = redis_client()
    wait_for(lambda: client.hlen(keys.results(job.key)) > 0, 180, "first results")
    # The stage is named after its stateful operator, and the policy gave it a hot standby.
    wait_for_caught_up_standby(job, "per_window")
    primary = Replica.objects.get(job=job, stage="per_window", role="primary")

    fault = inject(job, {"kind": "kill-driver", "target_operator": "per_window"})
    wait_for(
        lambda: RecoveryEpisode.objects.filter(job=job, fault=fault, action="promote").exists(),
        90,
        "the standby promoted",
    )
    # The standby's replica is now the stage's primary (the killed one is gone).
    wait_for(
        lambda: (
            Replica.objects.filter(job=job, stage="per_window", role="primary", state="running")
            .exclude(pk=primary.pk)
            .exists()
        ),
        60,
        "the promoted replica running as primary",
    )

    wait_for(lambda: client.xlen(keys.input_stream(job.key)) >= CLICKS, 180, "all input")
    expected = expected_activity(client, job.key)
    wait_for(lambda: written(client, job.key) == expected, 240, "exact results", poll_s=2)
    entries = client.xrange(keys.input_stream(job.key))
    definition = resolve_topology(job.topology).job
    assert user_plan.expected_results(definition, entries) == expected
    # Each recovery episode's audit (the output against the job's reference, up to the sink's
    # watermark) found nothing lost or duplicated.
    assert_episodes_audited_exact(job)
