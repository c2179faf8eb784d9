"""Blue/green upgrades of a running user job on the real controller, node agents and Spark
(docs/JOBS.md "Upgrading a running job"): the example job `activity@1` runs under adaptive, an
edited module is registered as `activity@2`, and the job is upgraded through the API. Every
test ends with the job's results equal to a plain-Python computation of its whole input (both
versions compute the same results), so nothing was lost or written twice across the switch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from console.models import Job, JobUpgrade, Policy, Replica
from console.redis import redis_client
from console.roles import ADMIN, OPERATOR
from infra.launcher import wait_for
from spark_runtime import keys
from tests.factories import UserFactory
from tests.integration.live import api, inject, replica_entry, wait_for_caught_up_standby
from tests.integration.test_user_job_live import expected_activity, iso, written

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "examples"
RATE = 50
CLICKS = 5000  # 100 s of input: the upgrade happens while input flows
# The latency test's input goes on well past the switch, which comes after the job's start,
# the registration of the new version and the state check (several minutes on a busy machine).
LONG_CLICKS = 15000

# Edits of jobs/examples/clickstream.py registered as activity@2.
# The same filter, written otherwise: the state is the running version's, the results equal.
SAME_STATE = (
    'return clicks.where((F.col("page") != "") & (F.col("dwell_ms") > 0))',
    'return clicks.where((F.length("page") > 0) & (F.col("dwell_ms") >= 1))',
)
# A filter that keeps fewer clicks: the state is compatible, the counts are not (an upgrade
# wrongly declared result-preserving).
OTHER_RESULTS = (
    '(F.col("dwell_ms") > 0))',
    '(F.col("dwell_ms") > 1000))',
)
# The stateful operator's state in 3 partitions instead of 1 (the results do not change).
MORE_PARTITIONS = (
    "            cpu=0.5,\n            mem=512,\n        ),",
    "            cpu=0.5,\n            mem=512,\n            parallelism=3,\n        ),",
)
# The grouping keys in another order: the state's key schema changes (Spark refuses the old
# state), the results do not.
NEW_STATE = (
    '.groupBy("user", F.window("event_time", WINDOW).alias("window"))',
    '.groupBy(F.window("event_time", WINDOW).alias("window"), "user")',
)

# The same filter with a Python UDF that keeps every row but sleeps 0.1 s per row once a marker
# file exists: the new version keeps up until the test creates the file after the switch, then
# falls behind (25 rows a batch at 50/s take 2.5 s a 0.5 s trigger).
SLOW_WHEN_MARKED = (
    'return clicks.where((F.col("page") != "") & (F.col("dwell_ms") > 0))',
    """import os
    import time

    from pyspark.sql.types import BooleanType

    def keep(page):
        if os.path.exists({mark!r}):
            time.sleep(0.1)
        return True

    kept = F.udf(keep, BooleanType())
    return clicks.where((F.col("page") != "") & (F.col("dwell_ms") > 0) & kept(F.col("page")))""",
)


@pytest.fixture(autouse=True)
def jobs_dir(tmp_path, monkeypatch):
    directory = tmp_path / "jobs"
    shutil.copytree(EXAMPLES, directory / "examples")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    return directory


@pytest.fixture(autouse=True)
def people(transactional_db):
    UserFactory(username="opal", role=OPERATOR)
    return UserFactory(username="adam", role=ADMIN)


@pytest.fixture
def admin(people) -> APIClient:
    """The API as the admin "adam" (registers the versions)."""
    client = APIClient()
    client.force_authenticate(people)
    return client


def validation_window(seconds: float) -> None:
    Policy.objects.create(upgrade_validation_s=seconds, reason="test: upgrade validation")


def register(admin_api, jobs_dir: Path, edit: tuple[str, str] | None = None) -> str:
    """Register the example module, edited by `edit` (old, new) first; returns NAME@VERSION."""
    if edit is not None:
        module = jobs_dir / "examples" / "clickstream.py"
        source = module.read_text()
        assert edit[0] in source, edit[0]
        module.write_text(source.replace(edit[0], edit[1]))
    response = admin_api.post(
        "/api/topologies/", {"module": "examples.clickstream:activity"}, format="json"
    )
    assert response.status_code in (200, 201), response.content
    body = response.json()
    return f"{body['name']}@{body['version']}"


def running_activity(clicks: int = CLICKS, strategy: str = "adaptive") -> Job:
    response = api().post(
        "/api/jobs/",
        {"name": "it-upgrade", "topology": "activity@1", "strategy": strategy,
         "params": {"rate": RATE, "count": clicks, "seed": 5}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "job running")
    client = redis_client()
    wait_for(lambda: client.hlen(keys.results(job.key)) > 0, 180, "first results")
    if strategy == "adaptive":
        wait_for_caught_up_standby(job, "per_window")
    return job


def ask_upgrade(job: Job, topology: str, result_preserving: bool = False) -> JobUpgrade:
    body = {"topology": topology, "result_preserving": result_preserving}
    response = api().post(f"/api/jobs/{job.pk}/upgrade/", body, format="json")
    assert response.status_code == 202, response.content
    return JobUpgrade.objects.get(pk=response.json()["id"])


def wait_status(upgrade: JobUpgrade, status: str, timeout_s: float = 240) -> JobUpgrade:
    def reached() -> bool:
        upgrade.refresh_from_db()
        assert upgrade.status not in (JobUpgrade.Status.REFUSED, JobUpgrade.Status.ABANDONED), (
            upgrade.status,
            upgrade.reason,
            upgrade.outcome,
        )
        return upgrade.status == status

    wait_for(reached, timeout_s, f"upgrade {status}", poll_s=1.0)
    return upgrade


def assert_exact(job: Job, clicks: int = CLICKS) -> None:
    client = redis_client()
    wait_for(lambda: client.xlen(keys.input_stream(job.key)) >= clicks, 360, "all input")
    expected = expected_activity(client, job.key)
    wait_for(lambda: written(client, job.key) == expected, 240, "exact results", poll_s=2)


def primary_of(job: Job, stage: str = "per_window") -> Replica | None:
    """The stage's running primary as its row says (rows follow the replicas' own reports at
    the next policy cycle); None while there is not exactly one."""
    rows = list(
        Replica.objects.filter(job=job, stage=stage, role="primary", state=Replica.State.RUNNING)
    )
    return rows[0] if len(rows) == 1 else None


def wait_primary(job: Job, local_id: str, stage: str = "per_window") -> None:
    wait_for(
        lambda: getattr(primary_of(job, stage), "local_id", None) == local_id,
        60,
        f"{local_id} the primary",
        poll_s=1.0,
    )


@pytest.mark.slow
def test_a_compatible_upgrade_is_seeded_switched_and_confirmed_with_exact_results(
    cluster, admin, jobs_dir
):
    validation_window(3600)  # confirmed by hand below
    assert register(admin, jobs_dir) == "activity@1"
    job = running_activity()
    blue = primary_of(job)
    assert register(admin, jobs_dir, SAME_STATE) == "activity@2"

    upgrade = wait_status(ask_upgrade(job, "activity@2"), JobUpgrade.Status.VALIDATING)
    assert upgrade.case == JobUpgrade.Case.SEEDED, upgrade.reason
    assert upgrade.checkpoint_batch is not None
    assert upgrade.blue_replica == blue.local_id
    job.refresh_from_db()
    assert job.topology == "activity@2"
    wait_primary(job, upgrade.green_replica)

    response = api().post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/confirm/")
    assert response.status_code == 202, response.content
    upgrade = wait_status(upgrade, JobUpgrade.Status.CONFIRMED, 60)
    assert "confirmed by opal" in upgrade.outcome
    assert_exact(job)
    history = api().get(f"/api/jobs/{job.pk}/upgrades/").json()
    assert [(u["to_topology"], u["status"]) for u in history["results"]] == [
        ("activity@2", "confirmed")
    ]


@pytest.mark.slow
def test_an_upgrade_with_incompatible_state_rebuilds_it_from_the_retained_input(
    cluster, admin, jobs_dir
):
    validation_window(20)  # confirmed by the controller once green wrote for 20 s
    register(admin, jobs_dir)
    job = running_activity()
    assert register(admin, jobs_dir, NEW_STATE) == "activity@2"
    upgrade = wait_status(ask_upgrade(job, "activity@2"), JobUpgrade.Status.CONFIRMED, 420)
    assert upgrade.case == JobUpgrade.Case.REBUILD, upgrade.reason
    assert "per_window" in upgrade.reason and "KEY_SCHEMA" in upgrade.reason
    assert "without a failure" in upgrade.outcome
    assert_exact(job)


@pytest.mark.slow
def test_a_new_parallelism_is_seeded_on_repartitioned_state_with_exact_results(
    cluster, admin, jobs_dir
):
    validation_window(20)  # confirmed by the controller, once green ran a batch after it
    register(admin, jobs_dir)
    job = running_activity(LONG_CLICKS)
    assert register(admin, jobs_dir, MORE_PARTITIONS) == "activity@2"
    upgrade = wait_status(ask_upgrade(job, "activity@2"), JobUpgrade.Status.CONFIRMED, 360)
    assert upgrade.case == JobUpgrade.Case.SEEDED, upgrade.reason
    assert "its state repartitioned from 1 to 3 partitions first" in upgrade.reason, upgrade.reason
    green = replica_entry(redis_client(), job, upgrade.green_replica)
    assert green["state_partitions"] == {"0": "repartitioned from 1 to 3 partitions"}
    assert_exact(job, LONG_CLICKS)


@pytest.mark.slow
def test_a_new_version_that_dies_while_validating_hands_the_output_back(cluster, admin, jobs_dir):
    validation_window(3600)
    register(admin, jobs_dir)
    job = running_activity()
    blue = primary_of(job)
    register(admin, jobs_dir, SAME_STATE)
    upgrade = wait_status(ask_upgrade(job, "activity@2"), JobUpgrade.Status.VALIDATING)
    # The stage's primary is green now (its row says so at once): the fault kills it.
    wait_primary(job, upgrade.green_replica)
    inject(job, {"kind": "kill-driver", "target_operator": "per_window"})
    upgrade = wait_status(upgrade, JobUpgrade.Status.ROLLED_BACK, 120)
    assert "failed after it" in upgrade.outcome
    wait_primary(job, blue.local_id)
    job.refresh_from_db()
    assert job.topology == "activity@1"
    assert_exact(job)


@pytest.mark.slow
def test_a_new_version_whose_latency_leaves_the_band_is_rolled_back(
    cluster, admin, jobs_dir, tmp_path
):
    validation_window(3600)
    register(admin, jobs_dir)
    job = running_activity(LONG_CLICKS)
    blue = primary_of(job)
    mark = tmp_path / "slow-down"
    register(admin, jobs_dir, (SLOW_WHEN_MARKED[0], SLOW_WHEN_MARKED[1].format(mark=str(mark))))
    upgrade = wait_status(ask_upgrade(job, "activity@2"), JobUpgrade.Status.VALIDATING)
    wait_primary(job, upgrade.green_replica)
    mark.touch()  # green falls behind from now on; blue, a standby again, keeps up
    upgrade = wait_status(upgrade, JobUpgrade.Status.ROLLED_BACK, 120)
    assert "p90 output latency averaged" in upgrade.outcome, upgrade.outcome
    wait_primary(job, blue.local_id)
    job.refresh_from_db()
    assert job.topology == "activity@1"
    assert_exact(job, LONG_CLICKS)


@pytest.mark.slow
def test_a_result_preserving_upgrade_whose_results_differ_is_rolled_back(cluster, admin, jobs_dir):
    """Declared result-preserving, the new version counts only clicks longer than a second:
    the old one, standing by, finds other counts on the keys both computed and the upgrade
    rolls back. The old version's output never stopped: nothing of its results is lost, every
    result is one of the two versions', and windows after the rollback are the old version's."""
    validation_window(3600)
    register(admin, jobs_dir)
    job = running_activity(LONG_CLICKS)
    blue = primary_of(job)
    register(admin, jobs_dir, OTHER_RESULTS)
    upgrade = ask_upgrade(job, "activity@2", result_preserving=True)
    upgrade = wait_status(upgrade, JobUpgrade.Status.ROLLED_BACK, 360)
    assert upgrade.case == JobUpgrade.Case.SEEDED, upgrade.reason
    assert "differ from the old version's" in upgrade.outcome, upgrade.outcome
    wait_primary(job, blue.local_id)
    job.refresh_from_db()
    assert job.topology == "activity@1"
    client = redis_client()
    wait_for(lambda: client.xlen(keys.input_stream(job.key)) >= LONG_CLICKS, 420, "all input")
    old = expected_activity(client, job.key)

    # Green wrote only while it was the primary: windows it could update then (open at the
    # switch, or still in the 30 s watermark) may keep its value (or, seeded with the old
    # version's state, a mix of both versions' counts) where the old version did not update
    # them again; every other window is the old version's.
    rolled_back_at = iso(int(upgrade.ended_at.timestamp() * 1000))
    greens_from = iso(int(upgrade.switched_at.timestamp() * 1000) - 40_000)
    seen: dict = {}

    def settled() -> bool:
        got = written(client, job.key)
        after = [k for k in old if k.split("|")[1] >= rolled_back_at]
        seen["missing"] = sorted(set(old) - set(got))[:3]
        seen["not the old version's"] = [
            (k, got[k], old.get(k))
            for k in got
            if got[k] != old.get(k) and not greens_from <= k.split("|")[1] < rolled_back_at
        ][:3]
        return after != [] and not any(seen.values())

    try:
        wait_for(settled, 240, "the old version's results after the rollback", poll_s=2)
    except RuntimeError:
        pytest.fail(f"results after the rollback at {rolled_back_at}: {seen}")


@pytest.mark.slow
def test_a_rollback_by_hand_gives_the_output_back_to_the_old_version(cluster, admin, jobs_dir):
    validation_window(3600)
    register(admin, jobs_dir)
    job = running_activity()
    register(admin, jobs_dir, SAME_STATE)
    upgrade = wait_status(ask_upgrade(job, "activity@2"), JobUpgrade.Status.VALIDATING)
    response = api().post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/rollback/")
    assert response.status_code == 202, response.content
    upgrade = wait_status(upgrade, JobUpgrade.Status.ROLLED_BACK, 60)
    assert "rolled back by opal" in upgrade.outcome
    assert_exact(job)


@pytest.mark.slow
def test_incompatible_state_without_the_input_to_rebuild_it_is_refused(cluster, admin, jobs_dir):
    register(admin, jobs_dir)
    job = running_activity()
    register(admin, jobs_dir, NEW_STATE)
    # The first entries of the input are gone (as a user trimming their own stream would).
    client = redis_client()
    first = client.xrange(keys.input_stream(job.key), count=50)
    client.xdel(keys.input_stream(job.key), *[entry_id for entry_id, _ in first])
    # The results no longer follow from the input: the cells of the deleted clicks stay.
    replicas_before = set(Replica.objects.filter(job=job).values_list("replica_id", flat=True))
    upgrade = ask_upgrade(job, "activity@2")
    wait_for(
        lambda: JobUpgrade.objects.get(pk=upgrade.pk).status == JobUpgrade.Status.REFUSED,
        240,
        "the upgrade refused",
    )
    upgrade.refresh_from_db()
    assert upgrade.reason.startswith("operator per_window: its state is incompatible")
    assert "the input before is gone" in upgrade.reason
    # Nothing started.
    assert set(Replica.objects.filter(job=job).values_list("replica_id", flat=True)) == (
        replicas_before
    )


@pytest.mark.slow
def test_a_strategy_change_protects_the_running_job_without_restarting_it(cluster, admin, jobs_dir):
    """local-restart -> active-all: the primary goes on, a standby starts beside it and takes
    over when the primary is killed (under local-restart the stage would have restarted)."""
    register(admin, jobs_dir)
    job = running_activity(LONG_CLICKS, strategy="local-restart")
    primary = primary_of(job)
    assert not Replica.objects.filter(job=job, role="standby", state="running").exists()
    response = api().post(f"/api/jobs/{job.pk}/upgrade/", {"strategy": "active-all"}, format="json")
    assert response.status_code == 202, response.content
    upgrade = wait_status(JobUpgrade.objects.get(pk=response.json()["id"]), "confirmed", 120)
    assert upgrade.case == JobUpgrade.Case.IN_PLACE, upgrade.reason
    job.refresh_from_db()
    assert job.strategy == "active-all"
    standby = wait_for_caught_up_standby(job, "per_window")
    # Nothing restarted: the primary is the one that ran before the change.
    assert primary_of(job).replica_id == primary.replica_id
    inject(job, {"kind": "kill-driver", "target_operator": "per_window"})
    wait_primary(job, standby.local_id)
    assert_exact(job, LONG_CLICKS)


@pytest.mark.slow
def test_restart_all_changed_to_adaptive_keeps_its_stage_and_gains_a_standby(
    cluster, admin, jobs_dir
):
    """restart-all runs the job as one stage called `job`, adaptive would call it `per_window`:
    the same operators in the same query, so the change is made in place under the running
    stage's name. The primary goes on, the policy gives the stage a seeded standby, and a kill
    then promotes it (under restart-all the whole job would have restarted)."""
    register(admin, jobs_dir)
    job = running_activity(LONG_CLICKS, strategy="restart-all")
    primary = primary_of(job, "job")
    assert primary is not None
    response = api().post(f"/api/jobs/{job.pk}/upgrade/", {"strategy": "adaptive"}, format="json")
    assert response.status_code == 202, response.content
    upgrade = wait_status(JobUpgrade.objects.get(pk=response.json()["id"]), "confirmed", 120)
    assert upgrade.case == JobUpgrade.Case.IN_PLACE, upgrade.reason
    standby = wait_for_caught_up_standby(job, "job")
    assert primary_of(job, "job").replica_id == primary.replica_id
    inject(job, {"kind": "kill-driver", "target_operator": "per_window"})
    wait_primary(job, standby.local_id, "job")
    assert_exact(job, LONG_CLICKS)
