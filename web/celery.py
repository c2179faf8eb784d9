"""The Celery app, configured from Django settings (CELERY_* names) with task autodiscovery."""

import os

from celery import Celery

from infra.queues import ALERTS_QUEUE, CONTROL_QUEUE

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings.local")

app = Celery("backstop")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Controller tasks go to `control` by default. Node-agent tasks must name their node's queue when
# sent (`apply_async(queue=node_queue(name))`); one sent without it lands in a queue no worker
# reads instead of running on the controller's host.
app.conf.task_default_queue = CONTROL_QUEUE
app.conf.task_routes = {
    "backstop.agent.*": {"queue": "node.unrouted"},
    # Alert deliveries and their sweep run on the alerts worker only.
    "backstop.alerts.*": {"queue": ALERTS_QUEUE},
}
# Every task module, listed explicitly (autodiscovery would only find workers/tasks.py).
app.conf.imports = (
    "workers.tasks",
    "workers.agent",
    "workers.controller",
    "workers.reporting",
    "workers.alerting",
)
