"""A Redis server of a test's own, which the test can crash and start again: for the tests of
Redis outages (the data plane's generator, a whole cluster under a Redis restart). The one
implementation is infra/redis_server.py (`manage.py soak` restarts its Redis with it too)."""

from infra.redis_server import PrivateRedis, free_port

__all__ = ["PrivateRedis", "free_port"]
