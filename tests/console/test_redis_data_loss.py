"""A Redis that lost its data under a running job (docs/RELIABILITY.md, "Redis without its
data"): the controller fences the job's stages off, stops its processes and fails it with what
was lost, and the job cannot be launched again. Real database and Redis; the node agents are
played at their Redis edge (tests/console/test_controller_crash_points.py)."""

from __future__ import annotations

import pytest

from console.models import ControlDecision, Job, Replica
from console.services import controller, fleet
from console.services.control import observe
from infra import keys as control_keys
from spark_runtime import keys as data_keys
from spark_runtime.sink import FENCE_LOST, FencedError, FencedWriter, HashRow, version
from tests.console.test_controller_crash_points import (
    kills_asked,
    nodes_up,  # noqa: F401 (a fixture)
    running_adaptive_job,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("nodes_up")]


def lose_the_data(client, job: Job) -> None:
    """What a Redis started again without persistence holds of the job: nothing."""
    data_keys.delete_job_keys(client, job.key)


def test_a_job_whose_data_redis_lost_is_fenced_off_stopped_and_failed(redis_conn):
    job, _ = running_adaptive_job(redis_conn)
    writer = FencedWriter(redis_conn, job.key, "wc")
    writer.acquire()  # the primary's epoch, 1
    lose_the_data(redis_conn, job)
    assert observe.load_supervisor(redis_conn, job) is None

    controller.without_state(job, redis_conn)

    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert job.status_reason.startswith(
        "Redis lost its data (supervision state, input stream, results, fencing epochs and "
        "sink watermarks gone); the job cannot continue exactly-once"
    )
    decision = ControlDecision.objects.get(job=job, kind=ControlDecision.Kind.GIVE_UP)
    assert decision.reason == job.status_reason
    # No writer can write, none can take a new epoch.
    assert redis_conn.get(data_keys.fence(job.key, "wc")) == FENCE_LOST
    with pytest.raises(FencedError):
        writer.upsert_hash("results", data_keys.results(job.key),
                           data_keys.result_versions(job.key),
                           [HashRow(version(1), "w001", "1")])  # fmt: skip
    with pytest.raises(Exception, match="not an integer"):
        FencedWriter(redis_conn, job.key, "wc").acquire()
    # Both replicas and the generator are asked to stop.
    assert {r for r, _ in kills_asked(redis_conn)} == {"wc-1", "wc-2", f"generator-{job.key}"}
    assert not Replica.objects.filter(job=job, state=Replica.State.RUNNING).exists()


def test_a_job_fenced_off_after_a_data_loss_is_not_launched_again(redis_conn):
    job, _ = running_adaptive_job(redis_conn)
    lose_the_data(redis_conn, job)
    controller.without_state(job, redis_conn)
    job.refresh_from_db()
    with pytest.raises(controller.LaunchError, match="Redis lost this job's data"):
        controller.launch_job(job)


def test_only_the_supervision_state_lost_fails_the_job_without_fencing_it(redis_conn):
    job, _ = running_adaptive_job(redis_conn)
    FencedWriter(redis_conn, job.key, "wc").acquire()
    redis_conn.xadd(data_keys.input_stream(job.key), {"id": "e0", "ts": "1", "text": "a"})
    redis_conn.delete(control_keys.controller_state(job.key))
    controller.without_state(job, redis_conn)
    job.refresh_from_db()
    assert (job.status, job.status_reason) == (
        Job.Status.FAILED, "supervision state lost: relaunch the job"
    )  # fmt: skip
    assert redis_conn.get(data_keys.fence(job.key, "wc")) == "1"


def test_a_controller_whose_lease_went_with_the_data_acts_on_nothing(redis_conn):
    # The supervisor in memory would see every heartbeat gone and restart every replica.
    job, sup = running_adaptive_job(redis_conn)
    ctl = fleet.FleetController(workers=1, client=redis_conn, owner="test-owner")
    ctl.view = fleet.read_fleet_view(redis_conn)
    assert ctl.leases.try_acquire(job.key)
    ctl.slots[job.key] = fleet.JobSlot(job=job, supervisor=sup, db_status=job.status)
    lose_the_data(redis_conn, job)  # the lease too
    assert ctl.reconcile(job.key) is None
    assert job.key not in ctl.held()
    assert kills_asked(redis_conn) == []
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING  # judged when a controller takes it again
