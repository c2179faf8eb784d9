"""Control-plane faults under a running job: Redis crashed, then PostgreSQL crashed, each started
again on its own data.

Redis carries everything of a running job (its input stream, its results, the fencing epochs,
the supervision state, the agents' queues), so this test gives the cluster a Redis of its own:
a `redis-server` with append-only persistence on a free port, which it SIGKILLs while an
adaptive wordcount job runs and starts again 3 s later on the same files. The database is a
PostgreSQL server of the test's own too (tests/postgres_server.py: the machine's server serves
others), whatever database the suite runs on: the test process and every worker use it, and
the test stops it as a crash does (`pg_ctl stop -m immediate`: every session ended) and starts
it again 3 s later, when it recovers from its write-ahead log. Then:
- the job's output goes on: the stages ride the outages out (the data plane's Redis clients
  retry for about 23 s, spark_runtime/redis_client.py; the stages do not use the database) and
  the generator writes again what the Redis crash lost (spark_runtime/generators.py);
- no replica fails: the primary is the same process afterwards and no episode is recorded;
- supervision goes on: the controller's Celery worker may stop on the broker loss (kombu 5.7
  does, docs/RELIABILITY.md); the launcher starts it again; reconciles that failed on the
  database are tried again a second later; a SIGKILL of the key stage's primary after the
  outages is answered with a promotion, recorded in the database;
- the final counts equal the ground truth computed in plain Python from the input stream, and
  the episode's audit finds nothing lost or duplicated.

The job is created in the private database and launched with a task sent to the private Redis
(the test process's own Celery app talks to the shared test Redis).
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from celery import Celery
from django.db import close_old_connections

from console.models import Job, RecoveryEpisode
from console.redis import redis_client
from console.roles import OPERATOR
from console.services.jobs import create_job
from infra.launcher import wait_for
from infra.queues import CONTROL_QUEUE
from spark_runtime import keys
from tests.cluster import Cluster, prepare
from tests.factories import UserFactory
from tests.integration.live import (
    RATE,
    assert_episodes_audited_exact,
    replica_entry,
    wait_for_caught_up_standby,
    wait_for_exact_results,
)
from tests.postgres_server import default_database

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

LINES = 4200  # 70 s of input at RATE: the generator is still writing when Redis goes down
DOWN_S = 3.0  # how long Redis, then PostgreSQL, stay down (at least)


def kill_primary(client, job: Job, replica_id: str) -> None:
    """SIGKILL a replica's process group (its Python driver and its JVM), as kill-driver does."""
    pid = replica_entry(client, job, replica_id)["pid"]
    os.killpg(os.getpgid(pid), signal.SIGKILL)


def words_counted(client, job: Job) -> int:
    return sum(int(count) for count in client.hvals(keys.results(job.key)))


def test_a_job_rides_out_redis_and_database_crashes(
    private_redis, private_postgres, tmp_path, settings
):
    with default_database(private_postgres.url):
        ride_out_outages(private_redis, private_postgres, tmp_path, settings)


def ride_out_outages(private_redis, private_postgres, tmp_path, settings) -> None:
    UserFactory(username="opal", role=OPERATOR)  # tests.integration.live's API user
    settings.REDIS_URL = private_redis.url  # this process's Redis clients read it at each call
    prepare()
    cluster = Cluster(tmp_path, redis_url=private_redis.url)
    try:
        cluster.start_all()
        client = redis_client(decode_responses=False)
        job = create_job(
            name="it-outages",
            topology="wordcount",
            strategy="adaptive",
            params={"rate": RATE, "count": LINES},
        )
        # Not the current app: shared tasks sent by later tests must keep the suite's broker.
        broker = Celery("it-outages", broker=private_redis.url, set_as_current=False)
        broker.send_task("backstop.controller.launch_job", args=(job.pk,), queue=CONTROL_QUEUE)
        broker.close()
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "running")
        wait_for(lambda: client.hlen(keys.results(job.key)) > 0, 120, "first results")
        primary_pid = replica_entry(client, job, "count-1")["pid"]

        # 1. Redis crashes and comes back on its append-only file.
        private_redis.crash()
        time.sleep(DOWN_S)
        private_redis.start()
        client = redis_client(decode_responses=False)
        written = client.xlen(keys.input_stream(job.key))
        counted = words_counted(client, job)
        assert written > 0 and counted > 0, "the append-only file brought the job's data back"
        wait_for(lambda: client.xlen(keys.input_stream(job.key)) > written, 60, "new input")
        wait_for(lambda: words_counted(client, job) > counted, 60, "new results")

        # 2. PostgreSQL crashes and comes back: the data path does not use it.
        private_postgres.crash()
        counted = words_counted(client, job)
        wait_for(lambda: words_counted(client, job) > counted, 30, "results, database down")
        time.sleep(DOWN_S)
        private_postgres.start()
        # What the web server does before each request: the kept connection, which the crash
        # ended, is replaced (it fails its health check, or is older than CONN_MAX_AGE).
        close_old_connections()
        assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING

        # The primary rode both outages out: same process, no failure recorded.
        assert psutil.pid_exists(primary_pid)
        assert replica_entry(client, job, "count-1")["pid"] == primary_pid
        assert not RecoveryEpisode.objects.filter(job=job).exists()

        # 3. Supervision goes on: a primary crash is answered with a promotion.
        # Promotable in the controller's view too, not only in the standby's own entry: killed
        # before it measured its lag, the primary is restarted instead (a CI run, 2026-11-27).
        wait_for_caught_up_standby(job, "count")
        kill_primary(client, job, "count-1")
        try:
            wait_for(
                lambda: RecoveryEpisode.objects.filter(job=job, action="promote").exists(),
                90,
                "a promotion after the outages",
            )
        except RuntimeError as exc:
            episodes = list(RecoveryEpisode.objects.filter(job=job).values_list("action", "notes"))
            raise AssertionError(
                f"{exc}; episodes {episodes}; launcher log {cluster.restarts()!r}"
            ) from exc

        wait_for_exact_results(client, job, LINES)
        assert_episodes_audited_exact(job)
    finally:
        cluster.stop()
