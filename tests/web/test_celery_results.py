"""Celery stores no task results: nothing reads them, and in an hour-long soak they were 2,676
of the 2,762 Redis keys left at the end."""

import uuid

import pytest
from celery.app.trace import build_tracer

from web.celery import app


@pytest.fixture
def probe_task():
    """`probe_task(**options)`: a task registered on the project's Celery app for this test only."""
    names = []

    def _register(**options):
        name = f"tests.celery_results.probe.{len(names)}"
        names.append(name)

        def probe():
            return "done"

        return app.task(name=name, **options)(probe)

    yield _register
    for name in names:
        app.tasks.unregister(name)


def run_as_a_worker(task) -> str:
    """Run `task` through the tracer a Celery worker runs it with; returns the task id."""
    task_id = str(uuid.uuid4())
    result = build_tracer(task.name, task, app=app)(task_id, (), {}, {})
    assert result.retval == "done"
    return task_id


def stored_result_keys(task_id: str) -> int:
    """How many result keys of `task_id` the result backend's Redis holds."""
    return app.backend.client.exists(app.backend.get_key_for_task(task_id))


def test_every_backstop_task_ignores_its_result():
    app.loader.import_default_modules()  # the task modules of app.conf.imports
    backstop = {name: task for name, task in app.tasks.items() if name.startswith("backstop.")}
    assert backstop
    assert [name for name, task in backstop.items() if not task.ignore_result] == []


def test_a_task_run_by_a_worker_leaves_no_result_key(probe_task):
    assert stored_result_keys(run_as_a_worker(probe_task())) == 0


def test_a_task_that_asks_for_its_result_still_gets_it(probe_task):
    # The check above would see a stored result: a task that opts in has one.
    task_id = run_as_a_worker(probe_task(ignore_result=False))
    try:
        assert stored_result_keys(task_id) == 1
    finally:
        app.backend.client.delete(app.backend.get_key_for_task(task_id))
