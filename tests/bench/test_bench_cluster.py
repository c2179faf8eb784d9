"""What the benchmark checks before it starts: jobs an interrupted run left live (ended), and
Backstop workers already running on this machine, such as the demo's (refused)."""

import subprocess
import sys

import pytest

from bench.strategy.run import (
    end_abandoned_bench_jobs,
    is_backstop_worker,
    other_backstop_workers,
)
from console.models import Job
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


def test_a_running_celery_worker_of_backstop_is_found_by_its_renamed_title():
    """A Celery worker renames itself (setproctitle); the benchmark must still see the demo's."""
    title = "[celeryd: agent-node-1@host:MainProcess] -active- (-A web worker -Q node.node-1)"
    code = (
        "import setproctitle, sys, time; setproctitle.setproctitle(sys.argv[1]); "
        "print('ready', flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, title], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        found = [line for line in other_backstop_workers() if line.startswith(f"pid {child.pid}:")]
        assert found, other_backstop_workers()
    finally:
        child.kill()
        child.wait()
    assert not is_backstop_worker(["python", "-m", "celery", "-A", "other", "worker"])
    assert is_backstop_worker(["/venv/bin/celery", "-A", "web", "beat"])
