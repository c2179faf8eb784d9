"""Reachability checks for /healthz: the database, Redis, and at least one Celery worker."""

from __future__ import annotations

import redis
from celery import current_app
from django.conf import settings
from django.db import DatabaseError, connection

from console.redis import redis_client

CHECK_TIMEOUT_S = 1.0


def check_database() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return False, f"database unreachable: {exc}"
    return True, connection.vendor


def check_redis(url: str | None = None) -> tuple[bool, str]:
    client = redis_client(url, decode_responses=False, timeout=CHECK_TIMEOUT_S)
    try:
        client.ping()
    except redis.RedisError as exc:
        return False, f"redis unreachable at {url or settings.REDIS_URL}: {exc}"
    finally:
        client.close()
    return True, "pong"


def check_celery() -> tuple[bool, str]:
    """Ping the workers through the broker; names the workers that answered."""
    replies = current_app.control.ping(timeout=CHECK_TIMEOUT_S) or []
    workers = sorted(name for reply in replies for name in reply)
    if not workers:
        return False, "no celery worker answered a ping"
    return True, ", ".join(workers)


def health_report() -> tuple[bool, dict]:
    """Run every check; the broker check is skipped when Redis (the broker) is down."""
    database_ok, database_detail = check_database()
    redis_ok, redis_detail = check_redis()
    if redis_ok:
        celery_ok, celery_detail = check_celery()
    else:
        celery_ok, celery_detail = False, "not checked: the broker (redis) is unreachable"
    checks = {
        "database": {"ok": database_ok, "detail": database_detail},
        "redis": {"ok": redis_ok, "detail": redis_detail},
        "celery": {"ok": celery_ok, "detail": celery_detail},
    }
    healthy = database_ok and redis_ok and celery_ok
    return healthy, {
        "status": "ok" if healthy else "unhealthy",
        "failing": [name for name, check in checks.items() if not check["ok"]],
        "checks": checks,
    }
