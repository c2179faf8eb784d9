"""/healthz with a real Celery worker process on the test Redis: all green."""

import subprocess
import sys

import pytest
from django.conf import settings

from infra.launcher import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def celery_worker():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "web",
            "worker",
            "-Q",
            "control",
            "-n",
            "health-test@%h",
            "--pool",
            "solo",
            "--loglevel",
            "WARNING",
        ],
        env={
            **__import__("os").environ,
            "DJANGO_SETTINGS_MODULE": "web.settings.test",
            "REDIS_URL": settings.REDIS_URL,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    yield proc
    proc.terminate()
    proc.wait(timeout=20)


def test_health_is_200_with_a_worker(client, celery_worker):
    wait_for(lambda: client.get("/healthz").status_code == 200, 60, "the worker to answer a ping")
    body = client.get("/healthz").json()
    assert body["failing"] == []
    assert "health-test@" in body["checks"]["celery"]["detail"]
