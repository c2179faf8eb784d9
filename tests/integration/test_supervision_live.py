"""The whole system with real parts: jobs launched through the API run on three node agents (real
Celery workers), a real controller supervises them, Spark runs the stages, Redis carries the data.

Scenarios (kept to two jobs so the module stays within a few minutes on 2 cores):
- adaptive wordcount: the controller process is SIGKILLed mid-job and started again, the job keeps
  running; then `kill-driver` on the key stage (count): the standby is promoted, an episode is
  recorded, and the final counts equal the ground truth computed from the input stream;
- local-restart wordcount: `kill-driver` on count restarts it from its checkpoint, exact results.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection
from rest_framework.test import APIClient

from console.models import ControlDecision, FaultInjection, Job, RecoveryEpisode, Replica
from console.roles import OPERATOR
from spark_runtime import keys
from tests.factories import NodeFactory, UserFactory
from web.launcher import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]

NODES = ("node-1", "node-2", "node-3")
LINES = 1500  # input entries per job (about 11,000 words)
RATE = 60


def database_url() -> str:
    """The test database, spelled for the worker processes."""
    conf = connection.settings_dict
    if conf["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{conf['NAME']}"
    user = conf.get("USER") or "postgres"
    host, port = conf.get("HOST") or "127.0.0.1", conf.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{conf['NAME']}"


class Cluster:
    """The controller, beat and three node agents as real processes, logs under `log_dir`."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "web.settings.test",
            "DATABASE_URL": database_url(),
            "TEST_REDIS_URL": django_settings.REDIS_URL,
            "CONTROLLER_DISPATCH": "true",
            "BACKSTOP_VAR_DIR": str(log_dir),
        }
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str, extra_env: dict | None = None) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (kept open for the child)
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "web", *args],
            env={**self.env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_controller(self) -> None:
        self.start(
            "controller", "worker", "-Q", "control", "-n", "it-controller@%h",
            "--pool", "threads", "--concurrency", "6", "--loglevel", "INFO",
        )  # fmt: skip

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)


@pytest.fixture
def cluster(transactional_db, tmp_path, settings):
    from console.services.schedules import ensure_periodic_tasks

    settings.CONTROLLER_DISPATCH = True  # the API sends real tasks to the real controller
    ensure_periodic_tasks()
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=8000.0)
    UserFactory(username="opal", role=OPERATOR)
    # Workers of an interrupted earlier run would take this run's tasks: end them first.
    subprocess.run(["pkill", "-9", "-f", "--", "-n it-"], check=False)
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    client.flushdb()  # no task or heartbeat left over from an earlier run
    cluster = Cluster(tmp_path)
    cluster.start_controller()
    cluster.start("beat", "beat", "--loglevel", "INFO", "--schedule", str(tmp_path / "beat.db"))
    for name in NODES:
        cluster.start(
            f"agent-{name}", "worker", "-Q", f"node.{name}", "-n", f"it-agent-{name}@%h",
            "--pool", "solo", "--loglevel", "INFO",
            extra_env={"BACKSTOP_NODE": name, "BACKSTOP_NODE_SCOPE": "processes",
                       "BACKSTOP_NODE_MEM_MB": "8000", "BACKSTOP_NODE_CPU": "2"},
        )  # fmt: skip
    wait_for(lambda: all(client.exists(f"backstop:node:{n}:hb") for n in NODES), 90, "node agents")
    try:
        yield cluster
        for job in Job.objects.filter(status__in=Job.LIVE_STATUSES):
            job.request_stop("test over")
        time.sleep(3)
    finally:
        cluster.stop()
    # Stage processes belong to the agents' sessions only loosely (own process groups): end them.
    subprocess.run(["pkill", "-9", "-f", "--", f"--checkpoint-dir {tmp_path}"], check=False)
    subprocess.run(["pkill", "-9", "-f", "spark_runtime generate"], check=False)


def api() -> APIClient:
    client = APIClient()
    assert client.login(username="opal", password="pw-for-tests")
    return client


def expected_counts(client, job_key: str) -> collections.Counter:
    """Ground truth in plain Python: the words of every input line."""
    counts = collections.Counter()
    for _, fields in client.xrange(keys.input_stream(job_key)):
        counts.update(fields[b"text"].decode().split())
    return counts


def results(client, job_key: str) -> collections.Counter:
    raw = client.hgetall(keys.results(job_key))
    return collections.Counter({k.decode(): int(v) for k, v in raw.items()})


def launch(strategy: str) -> Job:
    response = api().post(
        "/api/jobs/",
        {"name": f"it-{strategy}", "topology": "wordcount", "strategy": strategy,
         "params": {"rate": RATE, "count": LINES}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "job running")
    return Job.objects.get(pk=job.pk)


def inject_kill_driver(job: Job) -> FaultInjection:
    response = api().post(
        f"/api/jobs/{job.pk}/faults/", {"kind": "kill-driver", "target_operator": "count"},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.content
    fault_id = response.json()["id"]
    wait_for(lambda: FaultInjection.objects.get(pk=fault_id).outcome == "injected", 30, "injection")
    return FaultInjection.objects.get(pk=fault_id)


def wait_for_exact_results(client, job: Job) -> None:
    """Once the generator is done and the pipeline drained, results equal the ground truth."""
    wait_for(lambda: client.xlen(keys.input_stream(job.key)) >= LINES, 120, "all input")

    def drained() -> bool:
        return sum(results(client, job.key).values()) >= sum(
            expected_counts(client, job.key).values()
        )

    wait_for(drained, 240, "the pipeline to catch up", poll_s=2)
    time.sleep(3)  # a duplicate would show up as an overshoot after the catch-up
    assert results(client, job.key) == expected_counts(client, job.key)


def test_adaptive_survives_controller_restart_and_kill_driver(cluster):
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    job = launch("adaptive")
    count_standby = Replica.objects.filter(job=job, stage="count", role="standby").first()
    assert count_standby is not None, "adaptive gives the stateful count stage a standby"
    assert not Replica.objects.filter(job=job, stage="split", role="standby").exists()

    # Control-plane fault: the controller dies; the stages keep running without it.
    cluster.kill("controller")
    before = client.hlen(keys.results(job.key))
    time.sleep(6)
    assert client.exists(keys.heartbeat(job.key, "count-1"))
    cluster.start_controller()
    # The watchdog (beat, every 5 s) resumes supervision once the old lease has expired.
    wait_for(
        lambda: client.exists(f"backstop:{job.key}:controller-lease"), 60, "supervision resumed"
    )
    assert client.hlen(keys.results(job.key)) >= before

    fault = inject_kill_driver(job)
    wait_for(
        lambda: ControlDecision.objects.filter(job=job, kind="promote").exists(), 60, "promotion"
    )
    episode = RecoveryEpisode.objects.get(job=job, action="promote")
    assert episode.fault == fault
    assert episode.stage == "count"
    wait_for_exact_results(client, job)
    promoted = Replica.objects.get(replica_id=count_standby.replica_id)
    assert promoted.role == "primary"
    assert int(client.get(keys.fence(job.key, "count"))) >= 2


def test_local_restart_restarts_the_killed_stage_with_exact_results(cluster):
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    job = launch("local-restart")
    assert not Replica.objects.filter(job=job, role="standby").exists()
    time.sleep(8)
    inject_kill_driver(job)
    wait_for(
        lambda: ControlDecision.objects.filter(job=job, kind="restart-stage").exists(),
        60,
        "stage restart",
    )
    episode = RecoveryEpisode.objects.get(job=job)
    assert (episode.stage, episode.action) == ("count", "restart-stage")
    wait_for_exact_results(client, job)
