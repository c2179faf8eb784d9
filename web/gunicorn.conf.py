"""gunicorn settings for the console: one file for the demo, the image, compose and Kubernetes.

Run as `gunicorn -c web/gunicorn.conf.py web.wsgi:application` from the project root; options
given on the command line (the demo's `--bind`) override the ones here. From the environment:
GUNICORN_BIND (default 0.0.0.0:8000), WEB_CONCURRENCY (workers), GUNICORN_THREADS,
GUNICORN_TIMEOUT (infra/web_server.py says how each default is chosen) and GUNICORN_ACCESS_LOG
(default off; `-` logs every request to stderr).
"""

from infra.web_server import thread_count, timeout_s, worker_count
from spark_runtime.env import env

bind = env("GUNICORN_BIND", "0.0.0.0:8000")
workers = worker_count()
threads = thread_count()
worker_class = "gthread"
# Load Django and the Dash apps once, before forking: workers start at once and share the
# imported code's memory. Nothing connects at import (the database and Redis connect on first
# use in each worker).
preload_app = True
timeout = timeout_s()
graceful_timeout = 10
# Browsers and the load test keep their connection open between the 2-second refreshes.
keepalive = 5
# Replace each worker after this many requests (with jitter, not all at once): bounds what a slow
# leak in a library could take over days.
max_requests = 5000
max_requests_jitter = 500
accesslog = env("GUNICORN_ACCESS_LOG", "") or None
errorlog = "-"
proc_name = "backstop-web"


def when_ready(server):
    """Import the URLconf (and with it the Dash apps and their figures' libraries) in the master,
    before the workers are forked: each worker's first page then answers in milliseconds
    instead of seconds, and the imported code's memory is shared."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (imported for its side effect)
