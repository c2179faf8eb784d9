"""Every Celery task registers with the options its name carries (infra/tasks.py): one place
for expiry, acknowledgement, time limits and retries."""

from __future__ import annotations

import smtplib

import pytest
from celery import current_app
from django.db import OperationalError

from console.services import upgrade_state_check
from infra import tasks
from workers import agent, alerting, controller, reporting  # noqa: F401 (registers the tasks)
from workers import tasks as housekeeping  # noqa: F401

NAMES = [value for value in vars(tasks).values() if isinstance(value, tasks.TaskName)]


def test_every_task_name_is_a_registered_task():
    registered = set(current_app.tasks)
    assert len(NAMES) >= 24
    assert [name.name for name in NAMES if name.name not in registered] == []


@pytest.mark.parametrize("name", NAMES, ids=lambda name: name.name)
def test_a_registered_task_has_the_options_of_its_name(name):
    task = current_app.tasks[name.name]
    assert task.acks_late is name.acks_late
    assert task.reject_on_worker_lost is (True if name.reject_on_worker_lost else None)
    if name is tasks.CHECK_UPGRADE:  # its limits follow the dry run's bound
        assert task.time_limit == upgrade_state_check.CHECK_TIMEOUT_S + 60
    else:
        # None: the app's defaults (web/settings: CELERY_TASK_TIME_LIMIT and the soft one).
        assert task.time_limit == (name.time_limit_s or current_app.conf.task_time_limit)
        assert task.soft_time_limit == (
            name.soft_time_limit_s or current_app.conf.task_soft_time_limit
        )
    if name.retry is not None:
        assert task.max_retries == name.retry.max_retries


def test_the_workers_own_exceptions_are_retried():
    launch = current_app.tasks[tasks.LAUNCH_JOB.name]
    assert OperationalError in launch.autoretry_for and launch.retry_backoff == 2
    report = current_app.tasks[tasks.SEND_REPORT.name]
    assert smtplib.SMTPConnectError in report.autoretry_for
    assert (report.max_retries, report.retry_backoff, report.acks_late) == (4, 30, False)
