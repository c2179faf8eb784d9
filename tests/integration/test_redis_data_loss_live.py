"""Redis without its data: a Redis with no persistence SIGKILLed under a running job and started
again empty (docs/RELIABILITY.md, "Redis without its data").

Everything of the job lived there: its input stream, its results, the fencing epochs, the
supervision state, the agents' queues. The job cannot continue exactly-once: its checkpoints
point at input that is gone. Asserted, on a real cluster (controller, beat, three agents, Spark
stages) with a Redis of the test's own:
- within 60 s of Redis answering again, the job is failed with the plain reason;
- every stage is fenced off (its epoch is `FENCE_LOST`: no writer can write, none take over);
- the output after the event has no duplicated and no wrong result: every count in the results
  equals the count of that word in the input that remains (computed in plain Python), and the
  generator wrote no input again;
- the job's processes end.
"""

from __future__ import annotations

import time

import pytest
from celery import Celery

from console.models import Job, Replica
from console.redis import redis_client
from console.services.jobs import create_job
from infra.launcher import wait_for
from infra.processes import job_processes
from infra.queues import CONTROL_QUEUE
from spark_runtime import keys
from spark_runtime.sink import FENCE_LOST
from tests.cluster import Cluster, prepare
from tests.configured_redis import ConfiguredRedis
from tests.integration.live import RATE, expected_counts, results

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.django_db(transaction=True)]

LINES = 6000  # 100 s of input at RATE: the generator is still writing when Redis goes down
DOWN_S = 3.0
DECIDED_WITHIN_S = 60.0


def test_a_redis_that_comes_back_empty_fails_the_job_without_a_wrong_result(tmp_path, settings):
    server = ConfiguredRedis(tmp_path / "redis", persistent=False)
    server.start()
    settings.REDIS_URL = server.url  # this process's Redis clients read it at each call
    prepare()
    cluster = Cluster(tmp_path / "cluster", redis_url=server.url)
    try:
        cluster.start_all()
        client = redis_client(decode_responses=False)
        job = create_job(
            name="it-redis-empty",
            topology="wordcount",
            strategy="adaptive",
            params={"rate": RATE, "count": LINES},
        )
        broker = Celery("it-redis-empty", broker=server.url, set_as_current=False)
        broker.send_task("backstop.controller.launch_job", args=(job.pk,), queue=CONTROL_QUEUE)
        broker.close()
        wait_for(lambda: Job.objects.get(pk=job.pk).status == Job.Status.RUNNING, 180, "running")
        wait_for(lambda: client.hlen(keys.results(job.key)) > 0, 120, "first results")
        stages = set(Replica.objects.filter(job=job).values_list("stage", flat=True))
        print("before:", sum(results(client, job.key).values()), "words counted")

        server.crash()
        time.sleep(DOWN_S)
        server.start()  # empty: no append-only file, no save point
        back_at = time.time()
        client = redis_client(decode_responses=False)

        wait_for(
            lambda: Job.objects.get(pk=job.pk).status == Job.Status.FAILED,
            DECIDED_WITHIN_S,
            f"the job failed (launcher log: {cluster.restarts()!r})",
        )
        decided_s = time.time() - back_at
        job.refresh_from_db()
        print(f"failed {decided_s:.1f} s after Redis came back: {job.status_reason}")
        assert job.status_reason.startswith("Redis lost its data (supervision state")
        assert "the job cannot continue exactly-once" in job.status_reason
        for stage in stages:
            assert client.get(keys.fence(job.key, stage)) == FENCE_LOST.encode(), stage

        def ended() -> bool:
            return not job_processes({job.key})

        try:
            wait_for(ended, 60, "the job's processes ended", poll_s=2)
        except RuntimeError as timeout:
            left = [" ".join(process.cmdline()[-10:]) for process in job_processes({job.key})]
            raise AssertionError(f"{timeout}; still running: {left}") from timeout
        print(f"processes ended {time.time() - back_at:.1f} s after Redis came back")
        time.sleep(5)  # anything still on its way would have landed
        after, truth = results(client, job.key), expected_counts(client, job.key)
        print("after:", dict(after), "input entries:", client.xlen(keys.input_stream(job.key)))
        assert {w: (c, truth[w]) for w, c in after.items() if c != truth[w]} == {}
        assert client.xlen(keys.input_stream(job.key)) == 0, "no input written again"
    finally:
        cluster.stop()
        server.stop()
