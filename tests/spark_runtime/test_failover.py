"""Stage processes under the local runner, killed with SIGKILL at random points while input
flows: results must equal the ground truth (nothing lost, nothing counted twice), whether the
stage restarts from its checkpoint or its hot standby takes over."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time

import pytest

from spark_runtime import generators, keys
from spark_runtime.runner import build_runner
from tests.spark_runtime import truth

pytestmark = pytest.mark.spark

LINES = 600  # about 4,500 words
RATE = 60  # lines per second: the input keeps flowing for ~10 s, across the kills


def start_runner(client, redis_url, job, tmp_path, strategy, active=None):
    runner = build_runner(
        "wordcount",
        job,
        strategy,
        redis_url,
        client,
        active_stages=active,
        checkpoint_root=str(tmp_path / "checkpoints"),
        log_dir=str(tmp_path / "logs"),
    )
    runner.start()
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, kwargs={"stop": stop.is_set}, daemon=True)
    thread.start()
    return runner, stop, thread


def wait_running(client, job, replicas, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        states = {k: json.loads(v) for k, v in client.hgetall(keys.replicas(job)).items()}
        if all(states.get(r, {}).get("state") == "running" for r in replicas):
            return
        time.sleep(0.5)
    raise AssertionError(f"replicas not running: {client.hgetall(keys.replicas(job))}")


def wait_for_truth(client, job, timeout=150):
    """Poll until the results equal the ground truth; returns (expected, got)."""
    deadline = time.time() + timeout
    expected = truth.wordcount(truth.valid_entries(client, keys.input_stream(job), ["text"]))
    got = {}
    while time.time() < deadline:
        got = {w: int(c) for w, c in client.hgetall(keys.results(job)).items()}
        if got == expected:
            break
        time.sleep(1)
    return expected, got


def sigkill(runner, replica_id):
    os.killpg(runner.launcher.pid(replica_id), signal.SIGKILL)


def feed(client, job, seed):
    thread = threading.Thread(
        target=generators.generate,
        args=(client, job, "wordcount"),
        kwargs={"count": LINES, "rate": RATE, "seed": seed, "malformed_every": 100},
        daemon=True,
    )
    thread.start()
    return thread


def test_sigkill_of_stage_primaries_restarts_them_from_their_checkpoints(
    client, redis_url, job, tmp_path
):
    seed = int(os.environ.get("BACKSTOP_TEST_SEED", time.time()))
    rng = random.Random(seed)
    print(f"seed {seed}")
    runner, stop, thread = start_runner(client, redis_url, job, tmp_path, "local-restart")
    try:
        wait_running(client, job, ["split-1", "count-1"])
        generator = feed(client, job, seed)
        time.sleep(rng.uniform(1, 6))
        sigkill(runner, "split-1")
        time.sleep(rng.uniform(0.5, 3))
        sigkill(runner, "count-1")
        generator.join()
        expected, got = wait_for_truth(client, job)
    finally:
        stop.set()
        thread.join(timeout=60)
    history = [what for _, what in runner.supervisor.history]
    assert any("restart split-1" in h for h in history), history
    assert any("restart count-1" in h for h in history), history
    assert got == expected
    ids = [f["id"] for _, f in client.xrange(keys.channel_stream(job, "split"))]
    assert len(ids) == len(set(ids)) == sum(expected.values())
    assert client.xlen(keys.dead_letters(job)) == LINES // 100


def test_sigkill_of_a_primary_with_hot_standby_promotes_the_standby(
    client, redis_url, job, tmp_path
):
    seed = int(os.environ.get("BACKSTOP_TEST_SEED", time.time()))
    rng = random.Random(seed)
    print(f"seed {seed}")
    runner, stop, thread = start_runner(
        client, redis_url, job, tmp_path, "adaptive", active={"count"}
    )
    try:
        wait_running(client, job, ["split-1", "count-1", "count-2"])
        generator = feed(client, job, seed)
        time.sleep(rng.uniform(2, 8))
        killed_at = time.time()
        sigkill(runner, "count-1")
        generator.join()
        expected, got = wait_for_truth(client, job)
    finally:
        stop.set()
        thread.join(timeout=60)
    history = [what for _, what in runner.supervisor.history]
    assert any("promote count-2" in h for h in history), history
    assert any("count-2 is the primary" in h for h in history), history
    assert got == expected
    # The old primary's epoch is gone: the promoted standby wrote under a newer one.
    assert int(client.get(keys.fence(job, "count"))) >= 2
    # Detection and promotion are quick; how soon output flows again depends on how far the
    # standby lags on 2 shared cores (measured by `python -m spark_runtime.bench_failover`).
    promoted = [t for t, what in runner.supervisor.history if "count-2 is the primary" in what]
    assert promoted[0] - killed_at < 5
