"""An existing app (jobs/apps/window_counts.py, plain PySpark) on the real controller and node
agents, restarted after a kill-driver fault by a warm spare: the process that runs the app
after the kill was started before it (a spare, named in the replica's entry), and the app's
committed windows equal a plain-Python computation of its input (0 lost, 0 duplicated)."""

from __future__ import annotations

import json
import time

import psutil
import pytest
from rest_framework.test import APIClient

from bench.app_restart import workload
from console.models import Job
from console.redis import redis_client
from infra.launcher import wait_for
from spark_runtime import keys
from tests.integration.live import api, inject, replica_entry

# A spare's JVM and warm-up take a minute or more on 2 busy cores before the fault can find it.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("jobs_dir", "people"),
]


def idle_spares(client, node: str) -> int:
    return sum(1 for raw in client.hvals(keys.spares(node)) if json.loads(raw)["state"] == "idle")


def test_a_warm_spare_takes_over_a_killed_app_and_its_output_stays_exact(cluster, people, tmp_path):
    admin = APIClient()
    admin.force_authenticate(people)
    registered = admin.post(
        "/api/topologies/", {"app": "apps/window_counts.py", "name": "windows"}, format="json"
    )
    assert registered.status_code == 201, registered.content
    source, out = tmp_path / "in", tmp_path / "out"
    written = []
    for file in range(3):
        workload.write_input(source, file, workload.clicks(file))
        written += workload.clicks(file)
    response = api().post(
        "/api/jobs/",
        {"name": "it-warm-app", "topology": "windows@1", "strategy": "restart-all",
         "args": ["--in", str(source), "--out", str(out)]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 240, "job running")
    wait_for(lambda: workload.committed_rows(out), 240, "the first committed windows")
    client = redis_client()
    before = replica_entry(client, job, "job-1")
    # The controller asks for a spare for the app's job; it warms up on the app's node.
    wait_for(lambda: idle_spares(client, before["node"]) > 0, 300, "an idle warm spare", poll_s=1)

    killed_at = time.time()
    inject(job, {"kind": "kill-driver", "target_operator": "app"})
    wait_for(lambda: not psutil.pid_exists(before["pid"]), 30, "the app's process gone")
    for file in range(3, 8):
        workload.write_input(source, file, workload.clicks(file))
        written += workload.clicks(file)
    expected = workload.closed_windows(written)

    def exact() -> bool:
        return workload.exactness(expected, workload.committed_rows(out))["exact"]

    wait_for(exact, 240, "exact windows after the takeover", poll_s=1)
    after = replica_entry(client, job, "job-1")
    assert after["pid"] != before["pid"] and after.get("warm_spare", "").startswith("spare-")
    # The process running the app now was started before the kill: the spare, not a cold start.
    assert psutil.Process(after["pid"]).create_time() < killed_at
    outcome = workload.exactness(expected, workload.committed_rows(out))
    assert outcome["lost"] == outcome["duplicated"] == outcome["wrong"] == 0
    assert outcome["windows"] >= 6
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING

    stopped = api().post(f"/api/jobs/{job.pk}/stop/")
    assert stopped.status_code == 200, stopped.content
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.STOPPED, 90, "job stopped")
