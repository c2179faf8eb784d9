"""What the benchmark cleans up before it starts: jobs an interrupted run left live."""

import pytest

from console.models import Job
from console.services.bench import end_abandoned_bench_jobs
from tests.factories import UserFactory, make_job

pytestmark = pytest.mark.django_db


def test_only_the_benchmark_users_live_jobs_are_ended():
    bench, someone = UserFactory(username="bench"), UserFactory(username="otto")
    left = make_job(status=Job.Status.RUNNING, name="left")
    done = make_job(status=Job.Status.STOPPED, name="done")
    other = make_job(status=Job.Status.RUNNING, name="demo")
    Job.objects.filter(pk__in=[left.pk, done.pk]).update(created_by=bench)
    Job.objects.filter(pk=other.pk).update(created_by=someone)
    assert end_abandoned_bench_jobs() == 1
    statuses = dict(Job.objects.values_list("name", "status"))
    assert statuses == {"left": "failed", "done": "stopped", "demo": "running"}
    assert Job.objects.get(pk=left.pk).status_reason == "left live by an interrupted benchmark run"
