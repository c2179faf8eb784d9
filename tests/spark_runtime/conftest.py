"""Fixtures of the data-plane tests: a real Redis, per-test job ids, and the processes a test
starts through the launcher.

The Redis is the server of `TEST_REDIS_URL` (the one variable of the test Redis, also read by
web/settings/test.py), database 11: the Django tests use that URL's own database (15 by default)
and clear it, so the data-plane tests keep to a database of their own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from spark_runtime import keys
from spark_runtime.redis_client import connect

# web/settings/test.py's default; this conftest also runs without Django (`-p no:django`).
DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"
DATA_PLANE_DB = 11


def data_plane_redis_url(test_redis_url: str) -> str:
    """`test_redis_url` with its database replaced by DATA_PLANE_DB (same server, same
    credentials and options)."""
    return urlunsplit(urlsplit(test_redis_url)._replace(path=f"/{DATA_PLANE_DB}"))


REDIS_URL = data_plane_redis_url(os.environ.get("TEST_REDIS_URL", DEFAULT_TEST_REDIS_URL))

# py4j logs "Closing down clientserver connection" at interpreter exit, after pytest has closed
# the captured streams, which prints a "Logging error" traceback. Its INFO lines are not needed.
logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The data plane's own database of the test Redis (`redis_conn`, tests/conftest.py, connects
    to it here)."""
    return REDIS_URL


@functools.cache
def _connection() -> redis.Redis:
    conn = connect(REDIS_URL)
    try:
        conn.ping()
    except redis.exceptions.ConnectionError:
        pytest.fail(
            f"no Redis at {REDIS_URL}: bin/test starts one; set TEST_REDIS_URL (its server is used,"
            f" database {DATA_PLANE_DB})"
        )
    return conn


@pytest.fixture
def job():
    """A fresh job id; all its keys are deleted afterwards."""
    job_id = f"t{uuid.uuid4().hex[:8]}"
    yield job_id
    keys.delete_job_keys(_connection(), job_id)


@pytest.fixture
def started():
    """The processes a test starts (append their Popen): their sessions are killed at its end."""
    procs = []
    yield procs
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.kill()  # a child that, against the test, led no group of its own
        proc.wait()
