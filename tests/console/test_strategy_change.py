"""Changing a running job's strategy through an upgrade (console.services.upgrades,
upgrade_state_check and upgrade_control, the API and `manage.py upgrade_job --strategy`):
refused where the new strategy cuts the job into other stages, else recorded, made in place by
the job's reconcile and audited (real Redis and
database; the supervisor's part is tested purely in tests/spark_runtime/test_strategy_change.py,
a live job in tests/integration/test_upgrade_live.py)."""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import CommandError, call_command

from console.models import ControlDecision, Job, JobUpgrade
from console.redis import redis_client
from console.roles import OPERATOR
from console.services import controller, upgrade_control, upgrade_state_check, upgrades
from console.services.control.observe import load_supervisor, save_supervisor
from spark_runtime.replicas import HeartbeatSeen
from spark_runtime.supervision import Supervisor
from tests.factories import NodeFactory, make_job

pytestmark = pytest.mark.django_db


def running_job(
    strategy: str = "local-restart",
    topology: str = "wordcount",
    stages: dict | None = None,
) -> tuple[Job, Supervisor]:
    """A running job of `topology` under `strategy` and its supervisor, saved where the
    controller keeps it: by default wordcount, its stage `count` running split and count; each
    stage's first replica running as its primary."""
    for name in ("node-1", "node-2"):
        NodeFactory(name=name)
    stages = stages or {"count": ("split", "count")}
    job = make_job(Job.Status.RUNNING, topology=topology, strategy=strategy)
    sup = Supervisor(job.key, topology, stages, strategy, ["node-1", "node-2"])
    sup.start(0.0)
    for stage in stages:
        sup.handle(HeartbeatSeen(f"{stage}-1", 1.0, {"role": "primary", "state": "running",
                                                     "lag_s": 0.1, "batches": 1}))  # fmt: skip
    save_supervisor(redis_client(), job, sup)
    return job, sup


def running_wordcount(strategy: str = "local-restart") -> tuple[Job, Supervisor]:
    """A running wordcount job under `strategy` (its stage `count` runs split and count, its
    primary count-1 running) and its supervisor."""
    return running_job(strategy)


def test_a_strategy_change_is_checked_recorded_and_made_in_place(api_as):
    job, sup = running_wordcount("local-restart")
    client = redis_client()
    response = api_as(OPERATOR).post(
        f"/api/jobs/{job.pk}/upgrade/", {"strategy": "active-all"}, format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["from_strategy"], body["to_strategy"], body["status"]) == (
        "local-restart", "active-all", "requested",
    )  # fmt: skip
    # The parameters and the version stay what they are.
    assert (body["from_topology"], body["to_topology"], body["to_params"]) == (
        "wordcount", "wordcount", {},
    )  # fmt: skip
    upgrade = upgrade_state_check.check_upgrade(JobUpgrade.objects.get(pk=body["id"]), client)
    assert upgrade.case == JobUpgrade.Case.IN_PLACE, upgrade.reason
    assert "cut this job into the same stages (count)" in upgrade.reason
    # The job's reconcile: the record first (with the Job row), then the supervisor.
    assert upgrade_control.reconcile_upgrade(job, sup, time.time(), client) == []
    upgrade.refresh_from_db()
    assert upgrade.status == JobUpgrade.Status.CONFIRMED and upgrade.switched_at is not None
    assert Job.objects.get(pk=job.pk).strategy == "active-all" == job.strategy
    assert sup.strategy == "local-restart"
    controller.reconcile_strategy(job, sup, client)
    assert sup.strategy == "active-all" and sup.has_standby("count")
    (standby,) = [r for r in sup.replicas.values() if r.role == "standby"]
    assert standby.spec.node == "node-2" and standby.spec.seed_from == "count-1"
    reasons = ControlDecision.objects.filter(job=job, kind="add-standby")
    assert [r.reason for r in reasons] == [
        "strategy local-restart -> active-all: start standby count-2 on node-2"
    ]
    # A reconcile after it (or after a controller that died before saving it) changes nothing.
    assert sup.change_strategy(job.strategy, time.time()) == []


def test_a_controller_that_died_after_recording_the_change_makes_it_from_the_job_row(api_as):
    job, sup = running_wordcount("active-all")
    Job.objects.filter(pk=job.pk).update(strategy="local-restart")
    job.refresh_from_db()
    loaded = load_supervisor(redis_client(), job)
    assert loaded.strategy == "active-all"
    controller.reconcile_strategy(job, loaded, redis_client())
    assert loaded.strategy == "local-restart" and not loaded.has_standby("count")


@pytest.mark.parametrize(
    "body, words",
    [
        ({"strategy": "fastest"}, "strategy: must be one of restart-all, local-restart"),
        ({"strategy": "local-restart"}, "nothing to change"),
    ],
)
def test_bad_strategy_changes_are_refused_naming_the_field(api_as, body, words):
    job, _ = running_wordcount("local-restart")
    response = api_as(OPERATOR).post(f"/api/jobs/{job.pk}/upgrade/", body, format="json")
    assert response.status_code == 400, response.content
    assert words in str(response.json()["error"]["detail"])
    assert not JobUpgrade.objects.exists()


def test_a_strategy_change_is_an_upgrade_of_its_own(users):
    job = make_job(Job.Status.RUNNING, topology="topn", name="tn")
    with pytest.raises(upgrades.UpgradeRequestError, match="strategy: change the strategy in"):
        upgrades.request_upgrade(
            job, strategy="active-all", params={"topn.n": 3}, user=users[OPERATOR]
        )
    assert not JobUpgrade.objects.exists()


def test_a_strategy_that_cuts_the_job_otherwise_is_refused_and_nothing_changes(users):
    # local-restart runs topn's two stateful operators apart, active-all in one stage.
    apart = {"window_count": ("window_count",), "topn": ("topn",)}
    job, sup = running_job("local-restart", "topn", apart)
    upgrade = upgrades.request_upgrade(job, strategy="active-all", user=users[OPERATOR])
    upgrade = upgrade_state_check.check_upgrade(upgrade, redis_client())
    assert (upgrade.status, upgrade.case) == ("refused", "refused")
    assert upgrade.reason.startswith(
        "active-all cuts this job into other stages (window_count: window_count, topn) "
    )
    assert "(window_count: window_count; topn: topn)" in upgrade.reason
    assert Job.objects.get(pk=job.pk).strategy == "local-restart"
    assert load_supervisor(redis_client(), job).strategy == "local-restart"


def test_adaptive_takes_topns_operators_apart_as_local_restart_runs_them(users):
    """adaptive cuts topn so where its policy protects one stateful operator and not the
    other: a local-restart job changes to it in place, both stages going on."""
    apart = {"window_count": ("window_count",), "topn": ("topn",)}
    job, sup = running_job("local-restart", "topn", apart)
    upgrade = upgrades.request_upgrade(job, strategy="adaptive", user=users[OPERATOR])
    upgrade = upgrade_state_check.check_upgrade(upgrade, redis_client())
    assert upgrade.case == JobUpgrade.Case.IN_PLACE, upgrade.reason
    assert "cut this job into the same stages (window_count, topn)" in upgrade.reason


def test_restart_all_changes_in_place_under_its_stages_name(users):
    """restart-all calls wordcount's one stage `job` (the others `count`): the same operators
    in the same query, so the change is made in place and the stage keeps its name."""
    job, sup = running_job("restart-all", stages={"job": ("split", "count")})
    client = redis_client()
    upgrade = upgrades.request_upgrade(job, strategy="active-all", user=users[OPERATOR])
    upgrade = upgrade_state_check.check_upgrade(upgrade, client)
    assert upgrade.case == JobUpgrade.Case.IN_PLACE, upgrade.reason
    assert "cut this job into the same stages (job)" in upgrade.reason
    assert upgrade_control.reconcile_upgrade(job, sup, time.time(), client) == []
    job.refresh_from_db()
    controller.reconcile_strategy(job, sup, client)
    assert sup.strategy == "active-all" and sup.stages == ["job"]
    (standby,) = [r for r in sup.replicas.values() if r.role == "standby"]
    assert (standby.id, standby.spec.seed_from) == ("job-2", "job-1")


def test_the_command_changes_the_strategy(users):
    job, sup = running_wordcount("local-restart")
    out = io.StringIO()
    call_command("upgrade_job", str(job.pk), "--strategy", "active-all", "--as", "otto", stdout=out)
    assert "strategy local-restart -> active-all requested" in out.getvalue()
    with pytest.raises(CommandError, match="has an upgrade under way"):
        call_command("upgrade_job", str(job.pk), "--strategy", "adaptive", "--as", "otto")
