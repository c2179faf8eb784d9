"""The Celery app, configured from Django settings (CELERY_* names) with task autodiscovery."""

import os

from celery import Celery

from workers.queues import CONTROL_QUEUE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings.local")

app = Celery("backstop")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Tasks without an explicit queue go to the controller; node tasks are always routed explicitly.
app.conf.task_default_queue = CONTROL_QUEUE
app.autodiscover_tasks(["workers"])
