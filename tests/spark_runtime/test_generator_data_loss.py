"""The input generator stops when Redis comes back without its stream (Redis lost its data),
and writes again what an append-only crash lost (spark_runtime/generators.py)."""

import threading
import time

import redis

from spark_runtime import keys
from spark_runtime.generators import InputLost, generate, stream_lost
from tests.configured_redis import ConfiguredRedis


def test_stream_lost_rules():
    assert not stream_lost(5, 0, 100.0, 200.0)  # something came back
    assert stream_lost(0, 10, None, 200.0)  # it held entries when the generator started
    assert stream_lost(0, 0, 100.0, 200.0)  # written long before the crash
    assert not stream_lost(0, 0, 199.5, 200.0)  # a crash can lose the last second: write again
    assert not stream_lost(0, 0, None, 200.0)  # nothing written yet


def test_the_generator_stops_when_redis_comes_back_empty(tmp_path):
    server = ConfiguredRedis(tmp_path / "redis", persistent=False)
    server.start()
    try:
        client = redis.Redis.from_url(server.url, retry=None)
        outcome = {}

        def run():
            try:
                generate(client, "gl", "wordcount", count=100_000, rate=200)
            except Exception as exc:  # noqa: BLE001 (the outcome is what the test checks)
                outcome["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(3)
        assert client.xlen(keys.input_stream("gl")) > 0
        server.crash()
        time.sleep(1)
        server.start()  # empty: no append-only file, no save point
        thread.join(30)
        assert isinstance(outcome.get("error"), InputLost), outcome
        assert not client.exists(keys.input_stream("gl")), "no input written again"
    finally:
        server.stop()
