"""/healthz reports the database, Redis and Celery; it names what is down."""

import pytest
from django.test import override_settings

pytestmark = pytest.mark.django_db

# Nothing listens on port 1: a Redis that is down.
DOWN_REDIS = "redis://127.0.0.1:1/0"


@override_settings(REDIS_URL=DOWN_REDIS)
def test_health_with_redis_down_is_503_naming_redis(client):
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unhealthy"
    assert "redis" in body["failing"]
    assert body["checks"]["database"]["ok"] is True
    assert "127.0.0.1:1" in body["checks"]["redis"]["detail"]
    assert body["checks"]["celery"]["ok"] is False


def test_health_without_workers_names_celery(client):
    # The test Redis db has no worker consuming from it.
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["celery"]
