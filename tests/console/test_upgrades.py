"""Upgrades of running jobs on the console side (console.services.upgrades, upgrade_state_check
and upgrade_control, the API and `manage.py upgrade_job`): what is refused and why, the case
decided from a dry run's verdict, and the record following the supervisor through an upgrade
(real Redis and database; the dry run and the switching on real Spark are in
tests/integration/test_upgrade_live.py)."""

from __future__ import annotations

import io
import time
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from console.models import ControlDecision, Job, JobUpgrade, Policy
from console.redis import redis_client
from console.roles import OPERATOR, VIEWER
from console.services import controller, upgrade_control, upgrade_state_check, upgrades
from console.services.control.observe import load_supervisor
from spark_runtime import keys as data_keys
from spark_runtime import upgrade_check
from spark_runtime.replicas import HeartbeatSeen, KillReplica, PromoteStandby, StartReplica
from spark_runtime.supervision import Supervisor
from tests.agent_edge import publish_usage
from tests.factories import NodeFactory, make_job, progress_record

pytestmark = pytest.mark.django_db


def running_topn() -> Job:
    return make_job(Job.Status.RUNNING, topology="topn", name="tn")


def running_supervisor(job: Job) -> Supervisor:
    """The controller's supervisor of a topn job under local-restart: topn-1 runs."""
    sup = Supervisor(job.key, "topn", {"topn": ("window_count", "topn")}, "local-restart",
                     ["node-1", "node-2"])  # fmt: skip
    sup.start(0.0)
    sup.handle(
        HeartbeatSeen(
            "topn-1", 1.0, {"role": "primary", "state": "running", "lag_s": 0.5, "batches": 1}
        )
    )
    return sup


def test_an_operator_asks_for_an_upgrade_and_gets_the_record(api_as):
    job = running_topn()
    response = api_as(OPERATOR).post(
        f"/api/jobs/{job.pk}/upgrade/", {"params": {"topn.n": 3}}, format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["status"], body["from_topology"], body["to_topology"]) == (
        "requested", "topn", "topn",
    )  # fmt: skip
    assert body["to_params"] == {"topn.n": "3"} and body["requested_by"] == "otto"
    listed = api_as(VIEWER).get(f"/api/jobs/{job.pk}/upgrades/").json()
    assert [u["id"] for u in listed["results"]] == [body["id"]]


def test_a_viewer_may_not_upgrade(api_as):
    job = running_topn()
    response = api_as(VIEWER).post(
        f"/api/jobs/{job.pk}/upgrade/", {"params": {"topn.n": 3}}, format="json"
    )
    assert response.status_code == 403
    assert not JobUpgrade.objects.exists()


@pytest.mark.parametrize(
    "body, field, words",
    [
        ({"topology": "wordcount"}, "topology", "is not a version of the job's topology"),
        ({"params": {"topn.k": 3}}, "params", "'topn.k' is not a parameter"),
        ({"params": {"topn.n": True}}, "params", "must be a number or a string"),
        ({"params": [1]}, "params", "must be an object"),
        ({"params": {"topn.n": "9" * 10_000}}, "params", "a value has at most 256"),
        ({}, "non_field_errors", "nothing to change"),
        (
            {"strategy": "active-all", "result_preserving": True},
            "result_preserving",
            "only a blue/green upgrade",
        ),
        (
            {"params": {"topn.n": 3}, "mode": "stop_restart", "result_preserving": True},
            "result_preserving",
            "only a blue/green upgrade",
        ),
        ({"params": {"topn.n": 3}, "result_preserving": "maybe"}, "result_preserving", "valid"),
    ],
)
def test_bad_upgrade_requests_are_refused_naming_the_field(api_as, body, field, words):
    job = running_topn()
    response = api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrade/", body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["error"]["detail"]
    assert words in " ".join(errors[field]), errors
    assert not JobUpgrade.objects.exists()


def test_only_a_running_job_and_one_upgrade_at_a_time(api_as):
    stopped = make_job(Job.Status.STOPPED, topology="topn", name="old")
    response = api_as(OPERATOR).post(
        f"/api/jobs/{stopped.pk}/upgrade/", {"params": {"topn.n": 3}}, format="json"
    )
    assert response.status_code == 409
    assert "only a running job is upgraded" in response.json()["error"]["detail"]
    job = running_topn()
    first = api_as(OPERATOR).post(
        f"/api/jobs/{job.pk}/upgrade/", {"params": {"topn.n": 3}}, format="json"
    )
    assert first.status_code == 202
    again = api_as(OPERATOR).post(
        f"/api/jobs/{job.pk}/upgrade/", {"params": {"topn.n": 4}}, format="json"
    )
    assert again.status_code == 409
    assert "has an upgrade under way" in again.json()["error"]["detail"]


def test_confirm_waits_for_the_switch_and_rollback_is_passed_to_the_controller(api_as, users):
    job = running_topn()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    early = api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/confirm/")
    assert early.status_code == 409
    assert "can be confirmed once the new version writes" in early.json()["error"]["detail"]
    JobUpgrade.objects.filter(pk=upgrade.pk).update(status=JobUpgrade.Status.STARTING)
    response = api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/rollback/")
    assert response.status_code == 202
    upgrade.refresh_from_db()
    assert (upgrade.requested_action, upgrade.ended_by.username) == ("rollback", "otto")


def test_a_rollback_before_anything_started_cancels_the_upgrade_at_once(api_as, users):
    job = running_topn()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    response = api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrades/{upgrade.pk}/rollback/")
    assert response.status_code == 202
    upgrade.refresh_from_db()
    assert upgrade.status == "abandoned"
    assert upgrade.outcome == "cancelled before it started by otto"
    # The job may be upgraded again.
    assert upgrades.request_upgrade(job, params={"topn.n": 4}, user=users[OPERATOR]).pk


def test_the_case_follows_the_dry_run_and_the_input_the_job_still_has(users):
    job = running_topn()
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=5))
    job.refresh_from_db()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    client = redis_client()
    stream = data_keys.input_stream(job.key)
    client.delete(stream)
    started_ms = int(job.started_at.timestamp() * 1000)

    def case(verdict, detail="x"):
        found = {"verdict": verdict, "batch": 7, "detail": detail}
        return upgrade_state_check.decide_case(job, upgrade, "topn", found, client)

    assert case(upgrade_check.COMPATIBLE)[0] == JobUpgrade.Case.SEEDED
    assert "committed batch 7" in case(upgrade_check.COMPATIBLE)[1]
    assert case(upgrade_check.UNTESTED)[0] == JobUpgrade.Case.SEEDED
    found = {"verdict": upgrade_check.COMPATIBLE, "batch": 7, "detail": "x",
             "repartitioned": "repartitioned from 1 to 3 partitions"}  # fmt: skip
    assert upgrade_state_check.decide_case(job, upgrade, "topn", found, client)[1].endswith(
        "it starts from that checkpoint, its state repartitioned from 1 to 3 partitions first "
        "(another parallelism)"
    )
    refused, why = case(upgrade_check.SPARK_REFUSES, "AnalysisException: no column q")
    assert refused == JobUpgrade.Case.REFUSED and why.endswith("no column q")
    # Incompatible state, with every entry ever added still in the stream: rebuilt from it.
    first = client.xadd(stream, {"id": "1", "ts": "0"}, id=f"{started_ms + 1000}-0")
    client.xadd(stream, {"id": "2", "ts": "0"}, id=f"{started_ms + 2000}-0")
    rebuilt, why = case(upgrade_check.INCOMPATIBLE_STATE, "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE")
    assert rebuilt == JobUpgrade.Case.REBUILD
    assert why.startswith("operator window_count: its state is incompatible")
    assert "holds all 2 entries ever added" in why
    # An entry is gone (a user's XDEL or XTRIM): refused, naming the operator.
    client.xdel(stream, first)
    refused, why = case(upgrade_check.INCOMPATIBLE_STATE, "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE")
    assert refused == JobUpgrade.Case.REFUSED
    assert why.startswith("operator window_count:") and "the input before is gone" in why


def test_the_record_follows_the_supervisor_from_the_start_to_a_rollback(users):
    job = running_topn()
    Policy.objects.create(upgrade_validation_s=3600, reason="test")
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    sup = Supervisor(job.key, "topn", {"topn": ("window_count", "topn")}, "active-all",
                     ["node-1", "node-2", "node-3"])  # fmt: skip
    sup.start(0.0)
    for replica in list(sup.replicas.values()):
        sup.handle(
            HeartbeatSeen(
                replica.id,
                1.0,
                {"role": replica.role, "state": "running", "lag_s": 0.5, "batches": 1},
            )
        )
    # Not checked yet: nothing starts.
    assert upgrade_control.reconcile_upgrade(job, sup, time.time()) == []
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    (start,) = upgrade_control.reconcile_upgrade(job, sup, time.time())
    assert isinstance(start, StartReplica)
    assert start.replica.params == ("topn.n=3",) and start.replica.seed_from == "topn-1"
    upgrade.refresh_from_db()
    assert (upgrade.status, upgrade.blue_replica, upgrade.green_replica) == (
        "starting", "topn-1", "topn-3",
    )  # fmt: skip
    now = time.time()
    sup.handle(
        HeartbeatSeen(
            "topn-3", now, {"role": "standby", "state": "running", "lag_s": 0.5, "batches": 1}
        )
    )
    sup.handle(
        HeartbeatSeen(
            "topn-1", now, {"role": "standby", "state": "running", "lag_s": 0.5, "batches": 1}
        )
    )
    sup.handle(
        HeartbeatSeen(
            "topn-3", now, {"role": "primary", "state": "running", "lag_s": 0.5, "batches": 1}
        )
    )
    assert upgrade_control.reconcile_upgrade(job, sup, now) == []
    upgrade.refresh_from_db()
    job.refresh_from_db()
    assert upgrade.status == "validating" and upgrade.switched_at is not None
    upgrades.request_end(upgrade, upgrades.ROLLBACK, users[OPERATOR])
    actions = upgrade_control.reconcile_upgrade(job, sup, time.time())
    assert actions == [KillReplica("topn-3"), PromoteStandby("topn-1", "topn")]
    upgrade.refresh_from_db()
    assert upgrade.status == "rolled_back" and upgrade.outcome == "rolled back by otto"
    assert upgrade.ended_at is not None and upgrade.requested_action == ""
    kinds = set(ControlDecision.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds == {"upgrade"}


def switched_upgrade(
    user, validation_s: float, result_preserving: bool = False
) -> tuple[Job, JobUpgrade, Supervisor]:
    """A topn job whose upgrade (topn.n=3, seeded) has switched at 11.0: green topn-2 writes,
    blue topn-1 stands by; the policy validates for `validation_s`."""
    job = running_topn()
    Policy.objects.create(upgrade_validation_s=validation_s, reason="test")
    upgrade = upgrades.request_upgrade(
        job, params={"topn.n": 3}, user=user, result_preserving=result_preserving
    )
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    sup = running_supervisor(job)
    upgrade_control.reconcile_upgrade(job, sup, 10.0)
    for replica, role in (("topn-2", "standby"), ("topn-1", "standby"), ("topn-2", "primary")):
        reported = {"role": role, "state": "running", "lag_s": 0.5, "batches": 1}
        sup.handle(HeartbeatSeen(replica, 11.0, reported))
    upgrade_control.reconcile_upgrade(job, sup, 11.0)
    return job, upgrade, sup


def test_the_controller_confirms_once_green_wrote_for_the_validation_window(users):
    job, upgrade, sup = switched_upgrade(users[OPERATOR], validation_s=30)
    switched = sup.upgrade.switched_at
    assert upgrade_control.reconcile_upgrade(job, sup, switched + 29) == []
    # The window is over, but green has run no batch since the switch (idle input): its state
    # has not been loaded yet, so time alone does not confirm it.
    assert upgrade_control.reconcile_upgrade(job, sup, switched + 31) == []
    sup.handle(HeartbeatSeen("topn-2", switched + 32, {"role": "primary", "state": "running",
                                                       "batches": 2}))  # fmt: skip
    assert upgrade_control.reconcile_upgrade(job, sup, switched + 33) == [KillReplica("topn-1")]
    upgrade.refresh_from_db()
    assert upgrade.status == "confirmed"
    assert upgrade.outcome == "the new version wrote for 30 s without a failure"


def test_a_result_preserving_upgrade_is_confirmed_once_blue_compared_results(users, api_as):
    job, upgrade, sup = switched_upgrade(users[OPERATOR], validation_s=30, result_preserving=True)
    assert sup.upgrade.compare_results
    assert (
        api_as(VIEWER)
        .get(f"/api/jobs/{job.pk}/upgrades/")
        .json()["results"][0]["result_preserving"]
    )
    switched = sup.upgrade.switched_at
    green = {"role": "primary", "state": "running", "batches": 2}
    sup.handle(HeartbeatSeen("topn-2", switched + 32, green))
    # Green ran, the window is over, but blue has compared nothing yet: not confirmed by time.
    assert upgrade_control.reconcile_upgrade(job, sup, switched + 33) == []
    check = {"compared": 12, "differing": 0, "examples": []}
    blue = {"role": "standby", "state": "running", "batches": 9, "result_check": check}
    sup.handle(HeartbeatSeen("topn-1", switched + 34, blue))
    assert upgrade_control.reconcile_upgrade(job, sup, switched + 35) == [KillReplica("topn-1")]
    upgrade.refresh_from_db()
    assert upgrade.status == "confirmed"
    assert (upgrade.results_compared, upgrade.results_differing) == (12, 0)
    assert upgrade.outcome.endswith("its results equal to the old version's on the 12 keys both "
                                    "computed")  # fmt: skip


def test_a_result_preserving_upgrade_whose_results_differ_is_rolled_back(users):
    job, upgrade, sup = switched_upgrade(users[OPERATOR], validation_s=3600, result_preserving=True)
    check = {"compared": 30, "differing": 1, "examples": ["results 'w1': old 7, new 8"]}
    blue = {"role": "standby", "state": "running", "batches": 9, "result_check": check}
    sup.handle(HeartbeatSeen("topn-1", sup.upgrade.switched_at + 3, blue))
    actions = upgrade_control.reconcile_upgrade(
        job, sup, sup.upgrade.switched_at + 4, client=redis_client()
    )
    assert PromoteStandby("topn-1", "topn") in actions
    upgrade.refresh_from_db()
    assert upgrade.status == "rolled_back"
    assert "differ from the old version's on 1 of 30 keys" in upgrade.outcome
    assert "'w1': old 7, new 8" in upgrade.outcome


def test_the_command_asks_and_refuses_like_the_api(users):
    job = running_topn()
    out = io.StringIO()
    call_command("upgrade_job", str(job.pk), "--param", "topn.n=3", "--as", "otto", stdout=out)
    assert "requested; the state check runs first" in out.getvalue()
    with pytest.raises(CommandError, match="has an upgrade under way"):
        call_command("upgrade_job", "tn", "--param", "topn.n=4", "--as", "otto")
    with pytest.raises(CommandError, match="only operators and admins"):
        call_command("upgrade_job", "tn", "--param", "topn.n=4", "--as", "vera")
    call_command("upgrade_job", "tn", "--rollback", "--as", "otto", stdout=out)
    assert "rollback asked" in out.getvalue()
    with pytest.raises(CommandError, match="result_preserving: only a blue/green upgrade"):
        call_command("upgrade_job", "tn", "--strategy", "active-all", "--result-preserving",
                     "--as", "otto")  # fmt: skip


def test_record_and_saved_state_are_brought_together_after_a_controller_died_between(users):
    """The record is written before the supervisor's state is saved: a controller that died
    between the two leaves one ahead of the other."""
    job = running_topn()
    Policy.objects.create(upgrade_validation_s=3600, reason="test")
    sup = running_supervisor(job)
    # The record says green started; the saved state never started it: abandoned, green stopped.
    stale = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=stale.pk).update(
        case="seeded", stage="topn", status="starting", green_replica="topn-2"
    )
    assert upgrade_control.reconcile_upgrade(job, sup, 5.0) == [KillReplica("topn-2")]
    stale.refresh_from_db()
    assert stale.status == "abandoned" and "restarted before" in stale.outcome
    # The record was confirmed; the saved state still validates: confirmed there too.
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    upgrade_control.reconcile_upgrade(job, sup, 10.0)
    green = sup.upgrade.green
    for replica, role in ((green, "standby"), ("topn-1", "standby"), (green, "primary")):
        sup.handle(
            HeartbeatSeen(
                replica, 11.0, {"role": role, "state": "running", "lag_s": 0.5, "batches": 1}
            )
        )
    upgrade_control.reconcile_upgrade(job, sup, 11.0)
    assert sup.upgrade.phase == "validating"
    JobUpgrade.objects.filter(pk=upgrade.pk).update(status="confirmed", outcome="confirmed by otto")
    assert upgrade_control.reconcile_upgrade(job, sup, 12.0) == [KillReplica("topn-1")]
    assert sup.upgrade.phase == "confirmed"


def test_a_job_that_stops_ends_its_upgrade_under_way(users):
    job = running_topn()
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(status="validating")
    job.request_stop("stopped by otto")
    upgrade_control.end_open_upgrades(job, f"the job is {job.status}: {job.status_reason}")
    upgrade.refresh_from_db()
    assert upgrade.status == "abandoned"
    assert upgrade.outcome == "the job is stopping: stopped by otto"


def publish_output(client, job: Job, replica: str, seconds, p90_s: float) -> None:
    """One output batch of `replica` in each of `seconds` (epoch s), at p90 latency `p90_s`,
    with stream ids at those times (read_progress reads by id)."""
    for at in seconds:
        record = progress_record(
            replica=replica, stage="topn", query=f"{job.key}.topn.0", at=at,
            input_rows=50, rows_out=10, written=10, latency_p90=p90_s, latency_p99=p90_s,
        )  # fmt: skip
        client.xadd(data_keys.progress(job.key), record.to_fields(), id=f"{int(at * 1000)}-0")


def test_a_green_whose_latency_leaves_blues_band_is_rolled_back(users):
    job = running_topn()
    client = redis_client()
    now = float(int(time.time()))
    publish_output(client, job, "topn-1", [now - 60 + i for i in range(60)], p90_s=0.3)
    upgrade = upgrades.request_upgrade(job, params={"topn.n": 3}, user=users[OPERATOR])
    JobUpgrade.objects.filter(pk=upgrade.pk).update(case="seeded", stage="topn")
    sup = running_supervisor(job)
    upgrade_control.reconcile_upgrade(job, sup, now, client)
    # Blue's band: 0.3 s steady, so the limit is the floor's half a second above it.
    assert sup.upgrade.latency_limit_ms == pytest.approx(800.0)
    for replica, role in (("topn-2", "standby"), ("topn-1", "standby"), ("topn-2", "primary")):
        sup.handle(
            HeartbeatSeen(
                replica, now + 1, {"role": role, "state": "running", "lag_s": 0.5, "batches": 1}
            )
        )
    upgrade_control.reconcile_upgrade(job, sup, now + 1, client)
    assert sup.upgrade.phase == "validating"
    # Green writes at 0.5 s for 15 s (in band), then at 1.2 s; latency is judged from 10 s after
    # the switch on, over 10 s: out of band once most of the window is slow.
    publish_output(client, job, "topn-2", [now + 2 + i for i in range(15)], p90_s=0.5)
    publish_output(client, job, "topn-2", [now + 17 + i for i in range(20)], p90_s=1.2)
    assert (
        upgrade_control.reconcile_upgrade(job, sup, now + 10.5, client) == []
    )  # the switch's grace
    assert upgrade_control.reconcile_upgrade(job, sup, now + 21.5, client) == []
    actions = upgrade_control.reconcile_upgrade(job, sup, now + 31.5, client)
    assert KillReplica("topn-2") in actions and PromoteStandby("topn-1", "topn") in actions
    upgrade.refresh_from_db()
    assert upgrade.status == "rolled_back"
    assert "latency averaged 1.20 s" in upgrade.outcome and "(0.80 s)" in upgrade.outcome


def test_a_job_started_again_runs_the_parameters_of_its_last_confirmed_upgrade():
    client = redis_client()
    for name in ("node-1", "node-2"):
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=4096.0)
    publish_usage(client, ["node-1", "node-2"])  # alive for 5 s
    job = make_job(Job.Status.STOPPED, topology="topn", name="tn")
    JobUpgrade.objects.create(
        job=job, from_topology="topn", to_topology="topn", to_params={"topn.n": "3"},
        status=JobUpgrade.Status.CONFIRMED, ended_at=timezone.now(),
    )  # fmt: skip
    JobUpgrade.objects.create(
        job=job, from_topology="topn", to_topology="topn", to_params={"topn.n": "7"},
        status=JobUpgrade.Status.ROLLED_BACK, ended_at=timezone.now(),
    )  # fmt: skip
    controller.launch_job(job)
    supervisor = load_supervisor(client, job)
    assert supervisor.params == ("topn.n=3",)
    assert all("topn.n=3" in r.spec.params for r in supervisor.replicas.values())


def test_a_rollback_the_controller_cannot_carry_out_leaves_no_one_as_having_ended_it(users):
    job, upgrade, sup = switched_upgrade(users[OPERATOR], validation_s=3600)
    del sup.replicas["topn-1"]  # blue died after the switch: nothing to roll back to
    upgrades.request_end(upgrade, upgrades.ROLLBACK, users[OPERATOR])
    assert upgrade_control.reconcile_upgrade(job, sup, 12.0) == []
    upgrade.refresh_from_db()
    assert (upgrade.status, upgrade.requested_action, upgrade.ended_by) == ("validating", "", None)
    last = ControlDecision.objects.filter(job=job).order_by("-pk").first()
    assert "no rollback possible" in last.reason
