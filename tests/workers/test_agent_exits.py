"""The node agent publishes the exit of a replica process within a poll (EXIT_POLL_S), not
with its once-a-second heartbeat, and keeps an exit it could not publish for the next round;
the controller's tick wakes up on such an event instead of sleeping out its pause. Real
processes and a real Redis."""

import subprocess
import sys
import threading
import time

import pytest
import redis

from infra import keys
from workers.node import children, loops

NODE = "tn-exits"
JOB = "jk-exits"


@pytest.fixture(autouse=True)
def agent_events_cleared(redis_conn):
    redis_conn.delete(keys.agent_events(), keys.agent_events_cursor(JOB))
    yield
    redis_conn.delete(keys.agent_events(), keys.agent_events_cursor(JOB))


@pytest.fixture
def ended_child(tmp_path):
    """A replica process of JOB that exited with code 3, registered with the agent."""
    log = tmp_path / "ex-1.log"
    log.write_text("last words\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with children._children_lock:
        children._children[(JOB, "ex-1")] = (proc, JOB, log)
    yield proc
    with children._children_lock:
        children._children.pop((JOB, "ex-1"), None)


def exits_of(client) -> list[dict]:
    return [f for _, f in client.xrange(keys.agent_events()) if f.get("job") == JOB]


def test_an_exit_the_agent_could_not_publish_is_published_on_the_next_round(
    redis_conn, ended_child
):
    unreachable = redis.Redis(port=1, socket_connect_timeout=0.2, decode_responses=True)
    with pytest.raises(redis.RedisError):
        children.report_exits(unreachable, NODE)
    assert (JOB, "ex-1") in children._children
    children.report_exits(redis_conn, NODE)
    [event] = exits_of(redis_conn)
    assert (event["replica_id"], event["returncode"], event["node"]) == ("ex-1", "3", NODE)
    assert "last words" in event["log_tail"]
    assert (JOB, "ex-1") not in children._children
    children.report_exits(redis_conn, NODE)
    assert len(exits_of(redis_conn)) == 1, "published once"


def test_the_exit_watcher_publishes_an_exit_well_within_a_heartbeat(
    redis_conn, ended_child, monkeypatch
):
    stop = threading.Event()
    monkeypatch.setattr(loops, "_stop", stop)
    started = time.monotonic()
    watcher = threading.Thread(target=loops.report_exits_forever, args=(NODE,))
    watcher.start()
    try:
        while not exits_of(redis_conn) and time.monotonic() - started < 5:
            time.sleep(0.02)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        watcher.join()
    assert exits_of(redis_conn), "no exit published"
    assert elapsed < loops.PUBLISH_INTERVAL_S, f"published after {elapsed:.2f} s"
