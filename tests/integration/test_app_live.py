"""An existing app (jobs/apps/spend_totals.py, plain PySpark) on the real controller and node
agents: registered and started through the API with its arguments, its process killed by a
kill-driver fault, restarted from its checkpoints, its output exact against plain Python (0
lost, 0 duplicated), then stopped through the API; and an app that raises on start, given up on
with its file and line in the job's reason."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from console.models import ControlDecision, Job, RecoveryEpisode
from infra.launcher import wait_for
from tests.app_files import (
    large_found,
    newest_totals,
    purchases,
    spend_expected,
    write_input,
)
from tests.conftest import wait_until
from tests.integration.live import api, inject

pytestmark = [
    pytest.mark.spark,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("jobs_dir", "people"),
]

LARGE = 70


def test_an_app_survives_the_kill_of_its_process(cluster, people, tmp_path):
    admin = APIClient()
    admin.force_authenticate(people)
    registered = admin.post(
        "/api/topologies/", {"app": "apps/spend_totals.py", "name": "spend"}, format="json"
    )
    assert registered.status_code == 201, registered.content
    source, out = tmp_path / "in", tmp_path / "out"
    written = []
    for file in range(3):
        write_input(source, file, purchases(file))
        written += purchases(file)
    response = api().post(
        "/api/jobs/",
        {"name": "it-spend", "topology": "spend@1", "strategy": "restart-all",
         "args": ["--in", str(source), "--out", str(out), "--large", str(LARGE)]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "job running")
    wait_for(lambda: newest_totals(out / "totals"), 180, "the app's first output")

    fault = inject(job, {"kind": "kill-driver", "target_operator": "app"})
    for file in range(3, 8):
        write_input(source, file, purchases(file))
        written += purchases(file)
    totals, large = spend_expected(written, LARGE)
    wait_for(
        lambda: newest_totals(out / "totals") == totals and large_found(out) == large,
        180,
        "exact output after the restart",
        poll_s=1,
    )
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING
    # The controller saw the kill and restarted the app (restart-all: the whole job).
    episode = wait_until(
        lambda: RecoveryEpisode.objects.filter(job=job, fault=fault).first(), 60, "the episode"
    )
    assert episode.action == RecoveryEpisode.Action.RESTART_JOB

    stopped = api().post(f"/api/jobs/{job.pk}/stop/")
    assert stopped.status_code == 200, stopped.content
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.STOPPED, 60, "job stopped")
    assert newest_totals(out / "totals") == totals and large_found(out) == large
    # Stopped queries first, then the process (Supervisor.ask_app_to_stop), within the bound.
    stops = [d.reason for d in job.decisions.filter(kind=ControlDecision.Kind.STOP).order_by("at")]
    assert len(stops) == 1 and stops[0].endswith("asked to stop its queries"), stops


RAISES = """\
import sys

from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
source = sys.argv[2]
raise RuntimeError(f"cannot read {source}")
"""


def test_an_app_that_raises_on_start_fails_naming_its_line(cluster, people, jobs_dir):
    (jobs_dir / "apps" / "raises.py").write_text(RAISES)
    admin = APIClient()
    admin.force_authenticate(people)
    registered = admin.post("/api/topologies/", {"app": "apps/raises.py"}, format="json")
    assert registered.status_code == 201, registered.content
    response = api().post(
        "/api/jobs/",
        {"name": "it-raises", "topology": "raises@1", "strategy": "restart-all",
         "args": ["--in", "/data/in"]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    failed = wait_until(
        lambda: Job.objects.filter(pk=job_id, status=Job.Status.FAILED).first(),
        150,
        "the job given up on",
    )
    reason = failed.status_reason
    assert "apps/raises.py line 7: RuntimeError: cannot read /data/in" in reason
    # Three starts, each failing the same way, then no more (the policy's same-cause limit).
    assert "failed 3 times in a row with the same cause" in reason
    # The job page shows the reason with the app's last log lines: its traceback.
    assert 'File "apps/raises.py", line 7, in <module>' in reason
