"""Fixtures of the data-plane tests: a real Redis (db 11) and per-test job ids."""

from __future__ import annotations

import logging
import os
import uuid

import pytest
import redis

from spark_runtime import keys
from spark_runtime.redis_client import connect

REDIS_URL = os.environ.get("BACKSTOP_TEST_REDIS_URL", "redis://127.0.0.1:6379/11")

# py4j logs "Closing down clientserver connection" at interpreter exit, after pytest has closed
# the captured streams, which prints a "Logging error" traceback. Its INFO lines are not needed.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture(scope="session")
def client():
    conn = connect(REDIS_URL)
    try:
        conn.ping()
    except redis.exceptions.ConnectionError:
        pytest.fail(f"no Redis at {REDIS_URL}: bin/test starts one; set BACKSTOP_TEST_REDIS_URL")
    return conn


@pytest.fixture
def job(client):
    """A fresh job id; all its keys are deleted afterwards."""
    job_id = f"t{uuid.uuid4().hex[:8]}"
    yield job_id
    keys.delete_job_keys(client, job_id)
