"""The whole system with real parts: jobs launched through the API run on three node agents (real
Celery workers), a real controller supervises them, Spark runs the stages, Redis carries the data.

Scenarios (kept to two jobs so the module stays within a few minutes on 2 cores):
- adaptive wordcount (split and count chained into one stage): the controller process is
  SIGKILLed mid-job and started again, the job keeps running; then `kill-driver` on the key stage
  (count): the standby is promoted, an episode is recorded with its re-protect time, the new
  standby runs in a node's warm spare process, seeded from the new primary's checkpoint; then
  `kill-standby`: the standby's restart from its checkpoint also takes over a warm spare; killed
  again while its node's next spare is still warming up, it takes over that spare; the final
  counts equal the ground truth computed from the input stream;
- local-restart wordcount: `kill-driver` on count restarts it from its checkpoint, exact results.
Both jobs are then stopped through the API: every recovery episode closes, with the audit of the
output (lost and duplicated counts against the input) at zero.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from console.models import ControlDecision, FaultInjection, Job, RecoveryEpisode, Replica
from console.redis import redis_client
from console.roles import OPERATOR
from infra.keys import controller_lease
from infra.launcher import wait_for
from spark_runtime import keys
from spark_runtime.checkpoint_seed import committed_batch
from tests.cluster import NODES
from tests.factories import UserFactory
from tests.integration.live import (
    api,
    assert_episodes_audited_exact,
    inject,
    launch,
    replica_entry,
    wait_for_caught_up_standby,
    wait_for_exact_results,
)
from tests.proc_environ import environ_of
from workers.node.children import find_replica_process

# Each node a host of its own, so each keeps a warm spare: the scenario follows spares on the
# standby's node (nodes sharing a host share one: tests/policy/test_spares.py).
pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True), pytest.mark.own_hosts]

LINES = 1500  # input entries per job (about 11,000 words)


@pytest.fixture(autouse=True)
def operator_user(transactional_db):
    return UserFactory(username="opal", role=OPERATOR)


def spares_in_state(client, node: str, state: str) -> int:
    entries = client.hgetall(keys.spares(node)).values()
    return sum(1 for raw in entries if json.loads(raw)["state"] == state)


def became_from_spare(cluster, replica_id: str, times: int = 1) -> bool:
    """True when warm spares' logs say they became `replica_id` (at least `times` times)."""
    logs = (cluster.log_dir / "log" / "stages").glob("spare-*.log")
    said = sum(path.read_text(errors="replace").count(f"becomes {replica_id} ") for path in logs)
    return said >= times


def warmed_plan_then_became(cluster, plan: str, replica_id: str) -> bool:
    """True when a spare's log says it warmed up `plan` ("topology/stage") and later became
    `replica_id` (spark_runtime/spare_plans.py)."""
    for path in (cluster.log_dir / "log" / "stages").glob("spare-*.log"):
        text = path.read_text(errors="replace")
        warmed, became = text.find(f"warmed plan {plan} ("), text.find(f"becomes {replica_id} ")
        if -1 < warmed < became:
            return True
    return False


def became_while_warming(cluster, replica_id: str) -> bool:
    """True when a spare's log says it was taken while warming up and then became `replica_id`."""
    for path in (cluster.log_dir / "log" / "stages").glob("spare-*.log"):
        text = path.read_text(errors="replace")
        if "got a command while warming up" in text and f"becomes {replica_id} " in text:
            return True
    return False


def inject_kill_driver(job: Job) -> FaultInjection:
    return inject(job, {"kind": "kill-driver", "target_operator": "count"})


def live_standby(job: Job) -> Replica:
    """The stage count's standby once it is caught up (promotable), waiting for it: the policy
    may have moved the standby to another node meanwhile (it then has a new replica id)."""

    return wait_for_caught_up_standby(job, "count")


def scratch_of(job: Job, stage: str) -> Path:
    """The scratch directory (TMPDIR) of the process running `stage`'s primary, once it runs."""

    found = []

    def running() -> bool:
        replica = Replica.objects.filter(job=job, stage=stage, role="primary").order_by("pk").last()
        proc = replica and find_replica_process(replica.local_id, job.key)
        found[:] = [proc] if proc else []
        return bool(found)

    wait_for(running, 60, f"{stage}'s primary process")
    return Path(environ_of(found[0].pid)["TMPDIR"])


def local_id(replica: Replica) -> str:
    return replica.local_id


@pytest.mark.slow  # 162 s on CI: in a slice (tests/slow_slices.txt) to keep bin/test near 30 min
def test_adaptive_survives_controller_restart_and_kill_driver(cluster):
    client = redis_client(decode_responses=False)
    job = launch("adaptive", LINES)
    count_standby = Replica.objects.filter(job=job, stage="count", role="standby").first()
    assert count_standby is not None, "adaptive gives the stateful count stage a standby"
    assert not Replica.objects.filter(job=job, stage="split", role="standby").exists()

    # Control-plane fault: the controller dies; the stages keep running without it.
    cluster.kill("controller")
    before = client.hlen(keys.results(job.key))
    time.sleep(6)
    assert client.exists(keys.heartbeat(job.key, "count-1"))
    cluster.start_controller()
    # The controller started again takes the job once the dead one's lease has expired.
    wait_for(lambda: client.exists(controller_lease(job.key)), 60, "supervision resumed")
    assert client.hlen(keys.results(job.key)) >= before

    # The standby has committed work of its own (the next standby is seeded from it), and every
    # node keeps a warm spare for adaptive jobs (policy default: one per node).
    standby_checkpoint = cluster.log_dir / "checkpoints" / job.key / "count" / "count-2" / "0"
    wait_for(lambda: committed_batch(str(standby_checkpoint)) is not None, 180, "a standby batch")
    wait_for(
        lambda: all(spares_in_state(client, node, "idle") > 0 for node in NODES),
        180,
        "warm spares on every node",
    )
    # Killed while count is protected: a standby the policy moves (to a node whose Q rose as
    # the spares went idle) is not promotable until the new one has caught up.
    protecting = live_standby(job)
    fault = inject_kill_driver(job)
    wait_for(
        lambda: RecoveryEpisode.objects.filter(job=job, action="promote").exists(), 60, "promotion"
    )
    assert ControlDecision.objects.filter(job=job, kind="promote").exists()
    episode = RecoveryEpisode.objects.get(job=job, action="promote")
    assert episode.fault == fault
    assert episode.stage == "count"
    # The new standby is seeded from the promoted one's checkpoint and runs in a warm spare;
    # once it is caught up the episode gets its re-protect time.
    wait_for(
        lambda: RecoveryEpisode.objects.get(pk=episode.pk).reprotect_s is not None,
        180,
        "the new standby to be caught up",
    )
    new_standby = local_id(live_standby(job))
    assert new_standby != local_id(protecting)
    standby = replica_entry(client, job, new_standby)
    assert standby["role"] == "standby" and standby["seeded_batches"]["0"] is not None
    assert became_from_spare(cluster, new_standby)
    # The spare had run the job's count stage: the plans of every stage of the job are
    # published while it runs, the stage with a standby first.
    published = json.loads(client.hget(keys.spare_plans(), job.key))["plans"]
    stages = set(Replica.objects.filter(job=job).values_list("stage", flat=True))
    assert published[0]["stage"] == "count"
    assert {p["stage"] for p in published} == stages
    assert {p["topology"] for p in published} == {"wordcount"}
    assert warmed_plan_then_became(cluster, "wordcount/count", new_standby)
    # A restart from the checkpoint takes over a warm spare too: kill the standby once its node
    # has an idle spare again.
    node = standby["node"]
    wait_for(lambda: spares_in_state(client, node, "idle") > 0, 180, f"a warm spare on {node}")
    inject(job, {"kind": "kill-standby", "target_operator": "count"})
    wait_for(
        lambda: (
            replica_entry(client, job, new_standby).get("pid") not in (None, standby["pid"])
            and replica_entry(client, job, new_standby).get("state") == "running"
        ),
        180,
        "the standby restarted",
    )
    assert became_from_spare(cluster, new_standby, times=2)
    # With no idle spare on the node, a restart takes over the spare still warming up there
    # rather than start a second JVM beside it: kill the standby again as soon as its node
    # starts a new spare (after the re-protection, once the refill hold has expired).
    restarted_pid = replica_entry(client, job, new_standby)["pid"]
    warming = f"a spare warming up on {node}"
    wait_for(lambda: spares_in_state(client, node, "starting") > 0, 180, warming)
    assert spares_in_state(client, node, "idle") == 0
    inject(job, {"kind": "kill-standby", "target_operator": "count"})
    wait_for(
        lambda: (
            replica_entry(client, job, new_standby).get("pid") not in (None, restarted_pid)
            and replica_entry(client, job, new_standby).get("state") == "running"
        ),
        180,
        "the standby restarted in the warming spare",
    )
    assert became_while_warming(cluster, new_standby)
    wait_for_exact_results(client, job, LINES)
    promoted = Replica.objects.get(replica_id=protecting.replica_id)
    assert promoted.role == "primary"
    assert int(client.get(keys.fence(job.key, "count"))) >= 2
    assert_episodes_audited_exact(job)


def scrape_metrics(settings) -> dict[str, list]:
    """What Prometheus would get from /metrics now (family name -> samples)."""
    settings.METRICS_TOKEN = "it-scrape"
    response = api().get("/metrics", HTTP_AUTHORIZATION="Bearer it-scrape")
    assert response.status_code == 200
    families = text_string_to_metric_families(response.content.decode())
    return {family.name: family.samples for family in families}


def test_local_restart_restarts_the_killed_stage_with_exact_results(cluster, settings):
    client = redis_client(decode_responses=False)
    job = launch("local-restart", LINES)
    assert not Replica.objects.filter(job=job, role="standby").exists()
    time.sleep(8)
    # Prometheus' view of the running job agrees with the API's. Throughput appears once the
    # controller has stored the first batches with input (it ingests progress every cycle).
    job_id = str(job.pk)

    def producing(metrics) -> bool:
        series = metrics["backstop_job_throughput_events_per_second"]
        return any(s.labels["job_id"] == job_id and s.value > 0 for s in series)

    wait_for(lambda: producing(scrape_metrics(settings)), 60, "job throughput on /metrics")
    metrics = scrape_metrics(settings)
    detail = api().get(f"/api/jobs/{job.pk}/").json()
    running = [s.value for s in metrics["backstop_job_running"] if s.labels["job_id"] == job_id]
    assert running == [1.0]
    placed = sorted(
        (s.labels["stage"], s.labels["role"], s.labels["node"])
        for s in metrics["backstop_replica_info"]
        if s.labels["job_id"] == job_id
    )
    assert placed == sorted(
        (r["stage"], r["role"], r["node"])
        for r in detail["replicas"]
        if r["state"] not in ("stopped", "failed")
    )
    cycles = metrics["backstop_controller_cycle_age_seconds"]
    assert [s.value < 30 for s in cycles if s.labels["job_id"] == job_id] == [True]
    killed_scratch = scratch_of(job, "count")
    # The driver's temporary files are in its scratch directory, not /tmp: Spark's local
    # directories (shuffle files, the state stores' working copies) and the JVM's own.
    wait_for(
        lambda: {"blockmgr", "spark"} <= {p.name.split("-")[0] for p in killed_scratch.iterdir()},
        60,
        "Spark's local directories in the stage's scratch directory",
    )
    inject_kill_driver(job)
    wait_for(lambda: RecoveryEpisode.objects.filter(job=job).exists(), 60, "stage restart")
    assert ControlDecision.objects.filter(job=job, kind="restart-stage").exists()
    # What the killed driver left is removed once a process starts after it (spark_runtime/
    # scratch.py); the restarted stage has a directory of its own.
    wait_for(lambda: not killed_scratch.exists(), 60, "the killed driver's scratch swept")
    assert scratch_of(job, "count") != killed_scratch
    episode = RecoveryEpisode.objects.get(job=job)
    assert (episode.stage, episode.action) == ("count", "restart-stage")
    wait_for_exact_results(client, job, LINES)
    assert_episodes_audited_exact(job)
