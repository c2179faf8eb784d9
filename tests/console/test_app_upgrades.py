"""Upgrading an existing app on the console side (console.services.upgrades, upgrade_state_check
and upgrade_control, the API, `manage.py upgrade_job`): asked for like any upgrade, no dry run
(case app_restart), the record following the supervisor through stop, start and confirm or
rollback, and the controller's decisions (real Redis and database; on real Spark:
tests/integration/test_app_upgrade_live.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from console.models import ControlDecision, Job, JobUpgrade, RegisteredTopology
from console.redis import redis_client
from console.roles import OPERATOR
from console.services import upgrade_control, upgrade_state_check, upgrades
from infra import keys as control_keys
from infra.queues import node_queue
from spark_runtime import apps
from spark_runtime import upgrade as machine
from spark_runtime.replicas import HeartbeatSeen, ProcessExited, RestartStage
from spark_runtime.supervision import Supervisor
from spark_runtime.upgrade import StopApp
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db

EXAMPLES = Path(__file__).resolve().parents[2] / "jobs" / "apps"


@pytest.fixture
def windows(tmp_path, monkeypatch) -> Job:
    """A running job of the app windows@1, with windows@2 (another watermark delay) registered:
    their snapshots as registration stores them (its check, a child process, is tested in
    tests/console/test_app_registration.py)."""
    directory = tmp_path / "jobs"
    shutil.copytree(EXAMPLES, directory / "apps")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    path = directory / "apps" / "window_counts.py"
    for version in (1, 2):
        if version == 2:
            path.write_text(path.read_text().replace('"5 seconds"', '"8 seconds"'))
        source = apps.snapshot_text("apps/window_counts.py", directory)
        RegisteredTopology.objects.create(
            name="windows", version=version, app="apps/window_counts.py", source=source,
            source_sha256=hashlib.sha256(source.encode()).hexdigest(),
        )  # fmt: skip
    return make_job(Job.Status.RUNNING, topology="windows@1", strategy="restart-all", name="w")


def app_supervisor(job: Job) -> Supervisor:
    """The controller's supervisor of the app's job: job-1 runs, 3 batches done."""
    sup = Supervisor(job.key, job.topology, {"job": ("app",)}, "restart-all", ["node-1"])
    sup.start(0.0)
    sup.handle(HeartbeatSeen("job-1", 1.0, {"role": "primary", "state": "running", "batches": 3}))
    return sup


def saved(job: Job, sup: Supervisor) -> None:
    """The supervision state as the job's controller saved it (the state check reads it)."""
    redis_client().set(control_keys.controller_state(job.key), json.dumps(sup.to_dict()))


def started(job: Job, sup: Supervisor, users) -> JobUpgrade:
    """An upgrade to windows@2 asked for, checked and begun at 10.0 (the stop sent)."""
    upgrade = upgrades.request_upgrade(job, topology="windows@2", user=users[OPERATOR])
    saved(job, sup)
    upgrade_state_check.check_upgrade(upgrade, redis_client())
    assert upgrade_control.reconcile_upgrade(job, sup, 10.0) == [StopApp("job-1", 10.0)]
    upgrade.refresh_from_db()
    return upgrade


def test_an_app_upgrade_is_asked_for_through_the_api_and_checked_without_a_dry_run(windows, api_as):
    # What an app cannot change, named.
    for request, field, words in (
        ({"strategy": "adaptive"}, "strategy", "runs as one copy under restart-all"),
        ({"topology": "windows@2", "params": {"app.x": 1}}, "params", "not a parameter"),
        (
            {"topology": "windows@2", "result_preserving": True},
            "result_preserving",
            "does not run beside the new one",
        ),
    ):
        refused = api_as(OPERATOR).post(f"/api/jobs/{windows.pk}/upgrade/", request, format="json")
        assert refused.status_code == 400, request
        assert words in refused.json()["error"]["detail"][field][0]
    response = api_as(OPERATOR).post(
        f"/api/jobs/{windows.pk}/upgrade/", {"topology": "windows@2"}, format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["from_topology"], body["to_topology"]) == ("windows@1", "windows@2")
    assert body["mode"] == "stop_restart"  # the only way an app is upgraded
    upgrade = JobUpgrade.objects.get(pk=body["id"])
    saved(windows, app_supervisor(windows))
    upgrade_state_check.check_upgrade(upgrade, redis_client())
    upgrade.refresh_from_db()
    assert (upgrade.status, upgrade.case, upgrade.stage) == ("requested", "app_restart", "job")
    assert "job-1 stops its queries, then windows@2 starts from the same checkpoints" in (
        upgrade.reason
    )


def test_an_app_that_is_not_running_is_refused_at_the_check(windows, users):
    upgrade = upgrades.request_upgrade(windows, topology="windows@2", user=users[OPERATOR])
    sup = Supervisor(windows.key, "windows@1", {"job": ("app",)}, "restart-all", ["node-1"])
    sup.start(0.0)  # starting, not running yet
    saved(windows, sup)
    upgrade_state_check.check_upgrade(upgrade, redis_client())
    upgrade.refresh_from_db()
    assert upgrade.status == "refused" and "not running" in upgrade.outcome


def test_the_record_follows_a_stop_a_start_and_the_confirmation(windows, users):
    sup = app_supervisor(windows)
    upgrade = started(windows, sup, users)
    assert (upgrade.blue_replica, upgrade.green_replica) == ("job-1", "job-1")
    assert upgrade.status == "switching"
    # The old version stops, the new one starts on the same replica's checkpoints.
    (restart,) = sup.handle(ProcessExited("job-1", 12.0, 0))
    assert isinstance(restart, RestartStage) and restart.replica.topology == "windows@2"
    assert upgrade_control.reconcile_upgrade(windows, sup, 12.0) == []
    upgrade.refresh_from_db()
    windows.refresh_from_db()
    assert upgrade.status == "validating" and upgrade.switched_at is not None
    assert windows.topology == "windows@2"
    reported = {"role": "primary", "state": "running", "batches": 2, "started_at": 20.0,
                "query_batches": {"query-1": 2}}  # fmt: skip
    sup.handle(HeartbeatSeen("job-1", 30.0, reported))
    assert upgrade_control.reconcile_upgrade(windows, sup, 30.0) == []
    upgrade.refresh_from_db()
    assert upgrade.status == "confirmed"
    assert upgrade.outcome.startswith("each query of the new version (query-1) completed")
    windows.refresh_from_db()
    assert windows.topology == "windows@2"


def test_a_rollback_by_hand_restarts_the_old_version(windows, users):
    sup = app_supervisor(windows)
    upgrade = started(windows, sup, users)
    sup.handle(ProcessExited("job-1", 12.0, 0))
    upgrade_control.reconcile_upgrade(windows, sup, 12.0)
    upgrades.request_end(upgrade, upgrades.ROLLBACK, users[OPERATOR])
    (restart,) = upgrade_control.reconcile_upgrade(windows, sup, 20.0)
    assert restart.replica.topology == "windows@1"
    upgrade.refresh_from_db()
    windows.refresh_from_db()
    assert upgrade.status == "rolled_back" and upgrade.outcome == "rolled back by otto"
    assert windows.topology == "windows@1"


def test_the_planned_stop_is_an_upgrade_step_and_a_failed_new_version_a_failure(windows, users):
    """The controller's tick: the old version's exit is no failure (no failure decision); the
    new version's crash is one, and rolls back to the old version."""
    from console.services.controller import supervise_tick

    NodeFactory(name="node-1")
    client = redis_client()
    sup = app_supervisor(windows)
    upgrade = started(windows, sup, users)
    exits = control_keys.exits(windows.key)
    try:
        client.hset(exits, "job-1", json.dumps({"returncode": 0}))
        supervise_tick(windows, sup, client)
        assert sup.upgrade.phase == machine.VALIDATING
        assert sup.replicas["job-1"].spec.topology == "windows@2"
        decisions = ControlDecision.objects.filter(job=windows)
        assert not decisions.filter(kind=ControlDecision.Kind.FAILURE).exists()
        assert decisions.filter(
            kind="upgrade", reason__contains="job-1 ended; restart job-1"
        ).exists()
        # The new version crashes on start (its exit, after its relaunch): a failure, and the
        # old version restarts.
        client.hset(exits, "job-1", json.dumps({"returncode": 1}))
        supervise_tick(windows, sup, client)
        assert sup.upgrade.phase == machine.ROLLED_BACK
        assert sup.replicas["job-1"].spec.topology == "windows@1"
        assert decisions.filter(kind=ControlDecision.Kind.FAILURE).count() == 1
        upgrade_control.reconcile_upgrade(windows, sup, sup.upgrade.ended_at)
        upgrade.refresh_from_db()
        assert upgrade.status == "rolled_back"
        assert "the new version failed before its first batches" in upgrade.outcome
    finally:
        client.delete(exits, node_queue("node-1"), control_keys.exit_tails(windows.key))
