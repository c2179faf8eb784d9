"""Upgrading an existing app (jobs/apps/spend_totals.py, plain PySpark) on the real controller,
node agents and Spark: a new version of the file registered as spend@2 replaces the running one
through the API (stop, start from the same checkpoints, validated by a batch of each query).
A compatible new version is confirmed and its output appears; one whose aggregation's state
Spark refuses is rolled back, the old version running again from the checkpoints. Input files
keep arriving throughout, and the output is exact against plain Python across the upgrade (0
lost, 0 duplicated)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from console.models import ControlDecision, Job, JobUpgrade
from infra.launcher import wait_for
from tests.app_files import large_found, newest_totals, purchases, spend_expected, write_input
from tests.integration.live import api

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("jobs_dir", "people"),
]

LARGE = 70
# The compatible new version: its totals carry the version (its output is told apart); the
# aggregation, and so its state, is the same.
TAG_VERSION = (
    "    rows = [row.asDict() for row in batch.collect()]\n",
    '    rows = [row.asDict() | {"version": 2} for row in batch.collect()]\n',
)
# The incompatible one: one more aggregate, so another state schema, which Spark refuses to
# read from the running version's checkpoint (STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE).
ANOTHER_STATE = (
    '.agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("purchases"))',
    '.agg(F.sum("amount").alias("total"), F.count(F.lit(1)).alias("purchases"), '
    'F.max("amount").alias("top"))',
)


def register(people, jobs_dir: Path, edit: tuple[str, str] | None = None) -> str:
    """Register apps/spend_totals.py as `spend`, edited by `edit` (old, new) first."""
    if edit is not None:
        path = jobs_dir / "apps" / "spend_totals.py"
        source = path.read_text()
        assert edit[0] in source, edit[0]
        path.write_text(source.replace(edit[0], edit[1]))
    admin = APIClient()
    admin.force_authenticate(people)
    response = admin.post(
        "/api/topologies/", {"app": "apps/spend_totals.py", "name": "spend"}, format="json"
    )
    assert response.status_code in (200, 201), response.content
    body = response.json()
    return f"{body['name']}@{body['version']}"


class Input:
    """The app's input directory and every purchase written to it, in order."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.rows: list[dict] = []
        self.files = 0

    def add(self) -> None:
        rows = purchases(self.files)
        write_input(self.directory, self.files, rows)
        self.rows += rows
        self.files += 1


def running_spend(source: Input, out: Path) -> Job:
    for _ in range(3):
        source.add()
    response = api().post(
        "/api/jobs/",
        {"name": "it-spend-upgrade", "topology": "spend@1", "strategy": "restart-all",
         "args": ["--in", str(source.directory), "--out", str(out), "--large", str(LARGE)]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    # Generous: on this 2-core machine under other loads a stage's session took 2.5 min.
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 300, "job running")
    wait_for(lambda: newest_totals(out / "totals"), 400, "the app's first output")
    return job


def upgrade_while_input_arrives(job: Job, topology: str, source: Input, until: set[str]):
    """Ask for the upgrade through the API and write an input file every 2 s until its record
    reaches one of `until`; returns the record and how long that took."""
    asked = time.monotonic()
    response = api().post(f"/api/jobs/{job.pk}/upgrade/", {"topology": topology}, format="json")
    assert response.status_code == 202, response.content
    upgrade = JobUpgrade.objects.get(pk=response.json()["id"])
    deadline = asked + 900
    while time.monotonic() < deadline:
        upgrade.refresh_from_db()
        if upgrade.status in until:
            return upgrade, time.monotonic() - asked
        if not upgrade.under_way:
            steps = job.decisions.order_by("pk").values_list("reason", flat=True)
            raise AssertionError(
                f"upgrade {upgrade.status}: {upgrade.outcome}\n" + "\n".join(steps)
            )
        source.add()
        time.sleep(2)
    raise AssertionError(f"upgrade {upgrade.pk} still {upgrade.status} after 900 s")


def assert_exact_output(source: Input, out: Path) -> None:
    """The output of every input written so far, computed in plain Python, is what the app's
    sinks hold: each user's total and count, and every large purchase once."""
    totals, large = spend_expected(source.rows, LARGE)
    wait_for(
        lambda: newest_totals(out / "totals") == totals and large_found(out) == large,
        400,
        "exact output",
        poll_s=1,
    )


def totals_rows_since(out: Path, batch: int) -> list[dict]:
    """The rows of the totals files of batches after `batch`."""
    rows = []
    for file in (out / "totals").glob("batch-*.json"):
        if int(file.stem.split("-")[1]) > batch:
            rows += json.loads(file.read_text())
    return rows


def newest_batch(out: Path) -> int:
    return max(int(f.stem.split("-")[1]) for f in (out / "totals").glob("batch-*.json"))


def test_a_new_version_of_an_app_replaces_it_from_its_checkpoints(
    cluster, people, jobs_dir, tmp_path
):
    source, out = Input(tmp_path / "in"), tmp_path / "out"
    register(people, jobs_dir)
    job = running_spend(source, out)
    assert_exact_output(source, out)
    before = newest_batch(out)
    assert register(people, jobs_dir, TAG_VERSION) == "spend@2"

    upgrade, took = upgrade_while_input_arrives(job, "spend@2", source, {"confirmed"})
    print(f"app upgrade confirmed {took:.1f} s after the request")
    assert upgrade.case == JobUpgrade.Case.APP_RESTART and upgrade.mode == "stop_restart"
    assert upgrade.switched_at is not None
    assert upgrade.outcome.startswith("each query of the new version (large, totals) completed")
    for _ in range(2):
        source.add()
    # Exact across the upgrade: the new version went on from the old one's state and offsets.
    assert_exact_output(source, out)
    # Its output is there: the totals written after the upgrade carry its tag.
    after = totals_rows_since(out, before)
    assert any(row.get("version") == 2 for row in after)
    job.refresh_from_db()
    assert (job.status, job.topology) == (Job.Status.RUNNING, "spend@2")
    # In the job's upgrade history, with no failure in its decisions.
    history = api().get(f"/api/jobs/{job.pk}/upgrades/").json()["results"]
    assert [(u["id"], u["status"]) for u in history] == [(upgrade.pk, "confirmed")]
    assert not ControlDecision.objects.filter(job=job, kind="failure").exists()


def test_a_new_version_whose_state_spark_refuses_is_rolled_back_and_the_old_one_goes_on(
    cluster, people, jobs_dir, tmp_path
):
    source, out = Input(tmp_path / "in"), tmp_path / "out"
    register(people, jobs_dir)
    job = running_spend(source, out)
    assert_exact_output(source, out)
    assert register(people, jobs_dir, ANOTHER_STATE) == "spend@2"

    upgrade, took = upgrade_while_input_arrives(job, "spend@2", source, {"rolled_back"})
    print(f"app upgrade rolled back {took:.1f} s after the request: {upgrade.outcome}")
    assert upgrade.outcome.startswith("the new version failed before its first batches")
    assert "query totals of apps/spend_totals.py failed" in upgrade.outcome
    job.refresh_from_db()
    assert (job.status, job.topology) == (Job.Status.RUNNING, "spend@1")
    for _ in range(2):
        source.add()
    # The old version runs again from the checkpoints: its output goes on, exact.
    assert_exact_output(source, out)
    assert not any("top" in row for row in totals_rows_since(out, -1))
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
