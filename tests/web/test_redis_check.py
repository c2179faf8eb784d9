"""The system check of the Redis in use (console/checks.py) against real redis-servers of the
test's own, configured each way: what `manage.py check` says is what the server would do."""

from __future__ import annotations

import pytest
from django.core.checks import Info, Warning

from console.checks import check_redis_persistence, redis_config_warnings
from tests.configured_redis import ConfiguredRedis
from tests.redis_server import free_port


@pytest.fixture
def redis_with(tmp_path, settings):
    """Start a private redis-server with the given options; REDIS_URL points at it."""
    servers = []

    def start(persistent: bool, *args: str) -> ConfiguredRedis:
        server = ConfiguredRedis(tmp_path / f"redis-{len(servers)}", persistent, list(args))
        server.start()
        servers.append(server)
        settings.REDIS_URL = server.url
        return server

    yield start
    for server in servers:
        server.stop()


def ids(found) -> list[str]:
    return [message.id for message in found]


def test_appendonly_and_noeviction_give_no_warning(redis_with):
    redis_with(True, "--maxmemory", "100mb", "--maxmemory-policy", "noeviction")
    assert check_redis_persistence() == []


def test_a_redis_without_persistence_is_named_with_its_fix(redis_with):
    server = redis_with(False)
    found = check_redis_persistence()
    assert ids(found) == ["console.W003"]
    assert isinstance(found[0], Warning)
    assert f"127.0.0.1:{server.port}/0" in found[0].msg
    assert "appendonly no" in found[0].msg and "appendonly yes" in found[0].hint


def test_an_evicting_redis_is_named_with_its_fix(redis_with):
    redis_with(True, "--maxmemory", "10mb", "--maxmemory-policy", "allkeys-lru")
    found = check_redis_persistence()
    assert ids(found) == ["console.W002"]
    assert "maxmemory-policy allkeys-lru" in found[0].msg
    assert "noeviction" in found[0].hint


def test_snapshots_only_are_named(redis_with):
    redis_with(False, "--save", "900 1")
    found = check_redis_persistence()
    assert ids(found) == ["console.W004"]
    assert "save '900 1'" in found[0].msg


def test_an_unreachable_redis_gives_one_warning_quickly(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"  # nobody listens there
    found = check_redis_persistence()
    assert ids(found) == ["console.W001"]
    assert "did not answer" in found[0].msg


def test_a_maxmemory_with_noeviction_or_without_a_limit_is_fine():
    assert (
        redis_config_warnings(
            {"appendonly": "yes", "save": "", "maxmemory": "0", "maxmemory-policy": "allkeys-lru"},
            "here",
        )
        == []
    )
    assert not isinstance(Info, Warning)  # a CONFIG refused is information, not a warning
