"""The supervision lease (redis-py's Lock on the job's lease key), against the real Redis: one
window at a time, released at the end, and a window that lost its lease stops."""

import threading
import time

import pytest
import redis
from django.conf import settings

from console.models import Job
from console.services.control import observe
from spark_runtime.supervision import Supervisor
from tests.factories import make_job
from workers import controller as tasks
from workers.keys import controller_lease, controller_state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client():
    return redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)


def test_a_held_lease_keeps_a_second_window_out_and_a_window_releases_its_own(client):
    job = make_job(status=Job.Status.STOPPED)
    other = client.lock(controller_lease(job.key), timeout=5)
    assert other.acquire(blocking=False)
    assert tasks.supervise_job(job.pk) == f"job {job.pk} is supervised elsewhere"
    other.release()
    # A stopped job has nothing to supervise: the window ends at once and frees the lease.
    assert "live=False" in tasks.supervise_job(job.pk)
    assert not client.exists(controller_lease(job.key))


def test_a_window_that_loses_its_lease_stops_instead_of_supervising_twice(client):
    job = make_job(status=Job.Status.STARTING, strategy="local-restart")
    # A job whose replicas are still within their start-up grace: the window just ticks.
    sup = Supervisor(job.key, job.topology, {"wc": ("split", "count")}, job.strategy, ["n-1"])
    sup.start(time.time())
    observe.save_supervisor(client, job, sup)
    # Another holder takes the key over, as after this worker stalled past the lease.
    threading.Timer(1.0, lambda: client.set(controller_lease(job.key), "someone-else")).start()
    started = time.monotonic()
    assert tasks.supervise_job(job.pk) == f"job {job.pk}: lease lost"
    assert time.monotonic() - started < 10  # not the whole 30 s window
    assert client.get(controller_lease(job.key)) == "someone-else"  # not released by us
    client.delete(controller_lease(job.key), controller_state(job.key))
