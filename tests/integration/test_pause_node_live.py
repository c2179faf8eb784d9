"""pause-node on a live job: the stage processes on the node stop, run again after the pause
(SIGCONT from the agent, no shell involved), and the job's output comes back."""

from __future__ import annotations

import psutil
import pytest
import redis
from django.conf import settings
from rest_framework.test import APIClient

from console.models import FaultInjection, Job, Replica
from console.roles import OPERATOR
from infra import keys as control_keys
from infra.launcher import wait_for
from spark_runtime import keys
from tests.factories import UserFactory

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Short enough that the stage's heartbeat (TTL 3 s, renewed every 0.5 s) does not expire: the
# supervisor must not replace the paused process, so the test sees the same process run again.
PAUSE_S = 1.0


def output_total(client, job: Job) -> int:
    return sum(int(v) for v in client.hgetall(keys.results(job.key)).values())


def group_states(pid: int) -> set[str]:
    """The states of a stage process and its children (the JVM): its process group."""
    proc = psutil.Process(pid)
    return {p.status() for p in [proc, *proc.children(recursive=True)]}


def test_pause_node_stops_the_stage_and_it_runs_again(cluster):
    UserFactory(username="opal", role=OPERATOR)
    api = APIClient()
    assert api.login(username="opal", password="pw-for-tests")
    client = redis.Redis.from_url(settings.REDIS_URL)
    response = api.post(
        "/api/jobs/",
        {"name": "it-pause", "topology": "wordcount", "strategy": "restart-all",
         "params": {"rate": 40}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    wait_for(lambda: Job.objects.get(pk=job_id).status == Job.Status.RUNNING, 240, "job running")
    job = Job.objects.get(pk=job_id)
    wait_for(lambda: output_total(client, job) > 0, 180, "first output")
    primary = Replica.objects.filter(job=job, role="primary").select_related("node").get()

    response = api.post(
        f"/api/jobs/{job.pk}/faults/",
        {"kind": "pause-node", "target_node": primary.node.name,
         "params": {"duration_s": PAUSE_S}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    fault_id = response.json()["id"]
    wait_for(
        lambda: psutil.STATUS_STOPPED in group_states(primary.pid),
        30,
        "the stage process to be stopped",
        poll_s=0.02,
    )
    wait_for(
        lambda: psutil.STATUS_STOPPED not in group_states(primary.pid),
        10,
        "the stage process to run again",
        poll_s=0.05,
    )
    assert FaultInjection.objects.get(pk=fault_id).outcome == "injected"
    assert client.hlen(control_keys.paused_groups(primary.node.name)) == 0
    # The same process runs on and the job's output comes back.
    assert Replica.objects.get(pk=primary.pk).pid == primary.pid
    resumed_at = output_total(client, job)
    wait_for(lambda: output_total(client, job) > resumed_at, 60, "output after the pause")
    assert psutil.Process(primary.pid).is_running()
