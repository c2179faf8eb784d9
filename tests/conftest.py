"""Fixtures shared by the whole suite, and `wait_until`.

Redis: `redis_conn` is the one connection fixture (a client of `redis_url`, answering str). The
console's tests use TEST_REDIS_URL's database, as web/settings/test.py does; the data-plane
tests override `redis_url` with a database of their own (tests/spark_runtime/conftest.py). A
module whose tests write known keys clears them with a fixture named for them; one whose keys
are not all known asks for `redis_flushed`.
"""

import os
import shutil
import time
from pathlib import Path

import pytest
import redis
from hypothesis import settings as hypothesis_settings
from rest_framework.test import APIClient

from console.roles import ADMIN, OPERATOR, VIEWER
from infra.kafka_outage import BrokerKeeper
from spark_runtime.redis_client import connect
from tests.factories import UserFactory

# Hypothesis fails an example that takes over 200 ms of wall time. The property tests check
# what a pure function answers, not how fast (speed is the benchmarks'); on a shared 2-core
# machine a 1 ms example can take 400 ms while Spark tests run beside it, which failed a
# property that holds (tests/policy/test_resources.py, under load 35).
hypothesis_settings.register_profile("backstop", deadline=None)
hypothesis_settings.load_profile("backstop")

# web/settings/test.py's default for TEST_REDIS_URL.
DEFAULT_TEST_REDIS_URL = "redis://127.0.0.1:6379/15"


def wait_until(condition, timeout_s: float, what, poll_s: float = 0.05):
    """Poll `condition()` until it returns something true, and return that; fail the test once
    `timeout_s` have passed, naming `what` (a text, or a function that returns one then: the
    state worth seeing when the wait failed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"not within {timeout_s:g} s: {what() if callable(what) else what}"
            )
        time.sleep(poll_s)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis of the tests (bin/test starts one): TEST_REDIS_URL, as web/settings/test.py."""
    return os.environ.get("TEST_REDIS_URL", DEFAULT_TEST_REDIS_URL)


@pytest.fixture
def redis_conn(redis_url):
    """A client of `redis_url` for one test, answering str; fails the test at once, saying
    what to start, when no Redis answers there."""
    conn = connect(redis_url)
    try:
        conn.ping()
    except redis.exceptions.ConnectionError:
        pytest.fail(f"no Redis at {redis_url}: bin/test starts one; or set TEST_REDIS_URL")
    yield conn
    conn.close()


@pytest.fixture
def redis_flushed(redis_conn):
    """The test's Redis database emptied when the test ends."""
    yield
    redis_conn.flushdb()


@pytest.fixture(autouse=True)
def _clear_cache():
    """Login-failure counters live in the cache (Redis db 15 in tests): start each test clean."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def users(db):
    """One user per role plus one with no role."""
    return {
        VIEWER: UserFactory(username="vera", role=VIEWER),
        OPERATOR: UserFactory(username="otto", role=OPERATOR),
        ADMIN: UserFactory(username="ada", role=ADMIN),
        None: UserFactory(username="nobody"),
    }


@pytest.fixture
def api_as(users):
    """`api_as(role)` returns an APIClient authenticated as that role's user."""

    def _client(role):
        client = APIClient()
        client.force_authenticate(users[role])
        return client

    return _client


@pytest.fixture
def cluster(request, transactional_db, tmp_path, settings):
    """A real controller, beat and three node agents (see tests/cluster.py). The agents share
    this machine as their host (one host's warm spares), unless the test is marked
    `own_hosts`: then each node stands for a host of its own. Marked `kafka`: the console and
    every process of the cluster use the session's Kafka broker (`kafka_broker`), which this
    test process keeps meanwhile (infra/kafka_outage.py: the kafka-broker fault stops and
    starts it; it runs again when the test ends)."""
    from tests.cluster import Cluster, prepare

    settings.CONTROLLER_DISPATCH = True  # the API sends real tasks to the real controller
    env = {}
    broker = None
    if request.node.get_closest_marker("kafka") is not None:
        broker = request.getfixturevalue("kafka_broker")
        settings.KAFKA_BOOTSTRAP_SERVERS = env["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap_servers
    prepare()
    keeper = BrokerKeeper.for_broker(broker, settings.REDIS_URL).start() if broker else None
    running = Cluster(
        tmp_path, env=env, own_hosts=request.node.get_closest_marker("own_hosts") is not None
    )
    try:
        running.start_all()
        yield running
    finally:
        running.stop()
        if keeper is not None:
            keeper.stop()


@pytest.fixture
def private_redis(tmp_path):
    """A redis-server of the test's own with append-only persistence, which the test can crash
    and start again (tests/redis_server.py)."""
    from tests.redis_server import PrivateRedis

    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_postgres():
    """A PostgreSQL server of the test's own, which the test can crash and start again
    (tests/postgres_server.py); skipped where the server's binaries are not installed."""
    import pwd

    from tests.postgres_server import PrivatePostgres, postgres_bin_dir

    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("the PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run PostgreSQL as")
    server = PrivatePostgres(bin_dir)
    try:
        server.create()
        yield server
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """Apache Kafka's own broker (`kafka.Kafka` in KRaft mode, infra/kafka.py) of this test
    session, on free ports in a temporary directory: started by the first test that asks for
    it (one per session, about 3 s once the jars are cached), stopped at the end. Always a
    private one, whatever KAFKA_BOOTSTRAP_SERVERS says, so tests can stop, kill and start it
    (`stop_for`); a test that stops it starts it again before it ends. Its address:
    `kafka_broker.bootstrap_servers`."""
    from infra.kafka import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def jobs_dir(tmp_path, monkeypatch):
    """A jobs directory with the example apps (jobs/apps/), set before a cluster starts."""
    directory = tmp_path / "jobs"
    shutil.copytree(Path(__file__).resolve().parent.parent / "jobs" / "apps", directory / "apps")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    return directory
