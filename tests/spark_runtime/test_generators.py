"""The seeded input generator (real Redis): a generator started again resumes, so a repeated
start (the controller reconciles the job's input every cycle) never duplicates input; a Redis
crash while it writes neither loses nor repeats entries."""

from __future__ import annotations

import threading
import time

from infra.launcher import wait_for
from spark_runtime import generators, keys
from spark_runtime.redis_client import connect


def test_a_resumed_generator_goes_on_after_the_entries_already_written(redis_conn, job):
    assert generators.generate(redis_conn, job, "wordcount", count=40, rate=1e6, seed=3) == 40
    # Started again for the same target of 100 entries: it writes only the 60 missing ones.
    wrote = generators.generate(
        redis_conn, job, "wordcount", count=100, rate=1e6, seed=3, resume=True
    )
    assert wrote == 60
    again = generators.generate(
        redis_conn, job, "wordcount", count=100, rate=1e6, seed=3, resume=True
    )
    assert again == 0
    ids = [fields["id"] for _, fields in redis_conn.xrange(keys.input_stream(job))]
    assert ids == [f"e{n}" for n in range(100)]


def test_a_generator_rides_out_a_redis_crash_without_losing_or_repeating_entries(private_redis):
    """Redis SIGKILLed while the generator writes, started again on its append-only file a
    second later: the stream ends with every id once, in order."""
    client = connect(private_redis.url, ride_out_outages=False)
    total = 1500
    written = []
    writer = threading.Thread(
        target=lambda: written.append(
            generators.generate(client, "outage", "wordcount", count=total, rate=500, seed=7)
        )
    )
    writer.start()
    wait_for(lambda: client.xlen(keys.input_stream("outage")) > 300, 10, "the first entries")
    private_redis.crash()
    time.sleep(1)
    private_redis.start()
    writer.join(timeout=60)
    assert not writer.is_alive()
    ids = [fields["id"] for _, fields in client.xrange(keys.input_stream("outage"))]
    assert ids == [f"e{n}" for n in range(total)]
    assert written == [total]
