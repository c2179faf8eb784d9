"""The node agent publishes the exit of a replica process within a poll (EXIT_POLL_S), not
with its once-a-second heartbeat, and keeps an exit it could not publish for the next round;
the controller's tick wakes up on such an event instead of sleeping out its pause. Real
processes and a real Redis."""

import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest
import redis
from django.conf import settings

from console.services.control.observe import wait_for_agent_events
from workers import agent, keys

NODE = "tn-exits"
JOB = "jk-exits"


@pytest.fixture
def client():
    client = redis.Redis.from_url(settings.REDIS_URL, decode_responses=True)
    client.delete(keys.agent_events(), keys.agent_events_cursor(JOB))
    yield client
    client.delete(keys.agent_events(), keys.agent_events_cursor(JOB))


@pytest.fixture
def ended_child(tmp_path):
    """A replica process of JOB that exited with code 3, registered with the agent."""
    log = tmp_path / "ex-1.log"
    log.write_text("last words\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with agent._children_lock:
        agent._children["ex-1"] = (proc, JOB, log)
    yield proc
    with agent._children_lock:
        agent._children.pop("ex-1", None)


def exits_of(client) -> list[dict]:
    return [f for _, f in client.xrange(keys.agent_events()) if f.get("job") == JOB]


def test_an_exit_the_agent_could_not_publish_is_published_on_the_next_round(client, ended_child):
    unreachable = redis.Redis(port=1, socket_connect_timeout=0.2, decode_responses=True)
    with pytest.raises(redis.RedisError):
        agent._report_exits(unreachable, NODE)
    assert "ex-1" in agent._children
    agent._report_exits(client, NODE)
    [event] = exits_of(client)
    assert (event["replica_id"], event["returncode"], event["node"]) == ("ex-1", "3", NODE)
    assert "last words" in event["log_tail"]
    assert "ex-1" not in agent._children
    agent._report_exits(client, NODE)
    assert len(exits_of(client)) == 1, "published once"


def test_the_exit_watcher_publishes_an_exit_well_within_a_heartbeat(
    client, ended_child, monkeypatch
):
    stop = threading.Event()
    monkeypatch.setattr(agent, "_stop", stop)
    started = time.monotonic()
    watcher = threading.Thread(target=agent.report_exits_forever, args=(NODE,))
    watcher.start()
    try:
        while not exits_of(client) and time.monotonic() - started < 5:
            time.sleep(0.02)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        watcher.join()
    assert exits_of(client), "no exit published"
    assert elapsed < agent.PUBLISH_INTERVAL_S, f"published after {elapsed:.2f} s"


def test_the_controller_wakes_up_on_an_agent_event_and_otherwise_waits_its_pause(client):
    job = SimpleNamespace(key=JOB)
    client.xadd(keys.agent_events(), {"kind": "old", "job": JOB})
    [(last, _)] = client.xrange(keys.agent_events())
    client.set(keys.agent_events_cursor(JOB), last)  # everything so far was read

    started = time.monotonic()
    wait_for_agent_events(client, job, 0.3)
    assert time.monotonic() - started >= 0.25, "nothing new: it waits its pause"

    threading.Timer(0.2, client.xadd, (keys.agent_events(), {"kind": "exit", "job": JOB})).start()
    started = time.monotonic()
    wait_for_agent_events(client, job, 10)
    assert time.monotonic() - started < 5, "a new event ends the wait"
