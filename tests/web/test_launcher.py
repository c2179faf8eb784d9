"""The launcher's process group keeps its children running, as a process manager would: real
child processes, no Django."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from infra.launcher import wait_for
from infra.process_group import ProcessGroup


def starts_of(path) -> list[float]:
    """The start times a child wrote, one per line (each start appends its own)."""
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def test_a_child_that_exits_is_started_again_each_time_a_little_later(tmp_path):
    """A child that exits right after its start is started again after 1 s, then 2 s, ..."""
    marker = tmp_path / "starts"
    said = []
    group = ProcessGroup(tmp_path / "log", say=said.append)
    script = f"import time; open({str(marker)!r}, 'a').write(f'{{time.time()}}\\n')"
    group.start("flaky", [sys.executable, "-c", script])
    try:
        wait_for(lambda: len(starts_of(marker)) >= 3, 30, "three starts")
    finally:
        group.stop()
    first, second, third = starts_of(marker)[:3]
    # Lower bounds only: on a busy machine the gaps grow, they never shrink.
    assert second - first >= 0.9
    assert third - second >= 1.9
    assert said[:2] == [
        "restarted flaky (it exited with code 0; restart 1)",
        "restarted flaky (it exited with code 0; restart 2)",
    ]
    assert "restarted flaky" in (tmp_path / "log" / "launcher.log").read_text()


def test_a_killed_child_stays_down_and_stop_ends_the_rest(tmp_path):
    group = ProcessGroup(tmp_path, say=None)
    killed = group.start("killed", [sys.executable, "-c", "import time; time.sleep(60)"])
    kept = group.start("kept", [sys.executable, "-c", "import time; time.sleep(60)"])
    group.kill("killed")
    assert killed.poll() is not None
    assert group.restart_exited() == []
    assert list(group.children) == ["kept"]
    group.stop(grace_s=5)
    assert kept.poll() is not None
    assert group.restart_exited() == []
    assert not (tmp_path / "launcher.log").exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="kernel without autogroups")
def test_a_child_gets_its_sessions_priority_at_every_start(tmp_path):
    """The launcher sets a child's session priority (its process group and its autogroup) right
    after starting it, and again after restarting it: a control-plane process starts at its
    priority, not at the level of whatever else the machine runs. Level 7: a lower priority,
    which any process may give its children."""
    group = ProcessGroup(tmp_path, say=None)
    first = group.start("low", [sys.executable, "-c", "import time; time.sleep(60)"], nice=7)
    try:
        assert os.getpriority(os.PRIO_PROCESS, first.pid) == 7
        assert Path(f"/proc/{first.pid}/autogroup").read_text().split()[-1] == "7"
        os.killpg(first.pid, signal.SIGKILL)
        # The group's watcher starts it again (after a second: it exited soon after its start).
        wait_for(lambda: group.children["low"].proc.pid != first.pid, 30, "the restart")
        second = group.children["low"].proc
        assert os.getpriority(os.PRIO_PROCESS, second.pid) == 7
        assert Path(f"/proc/{second.pid}/autogroup").read_text().split()[-1] == "7"
    finally:
        group.stop(grace_s=5)


def test_only_a_heartbeat_taken_since_the_start_counts():
    """A local cluster waits for its own agents' heartbeats: the beat a previous cluster's agent
    left in Redis (with its TTL still running) is older than the start and does not count."""
    import json
    import time
    import uuid

    from console.redis import redis_client
    from infra.keys import node_heartbeat
    from infra.launcher import beat_since

    client = redis_client()
    node = f"node-{uuid.uuid4().hex[:8]}"
    started = time.time()
    try:
        assert not beat_since(client, node, started)
        client.set(node_heartbeat(node), json.dumps({"at": started - 2.0}), ex=5)
        assert not beat_since(client, node, started), "a previous agent's beat"
        client.set(node_heartbeat(node), json.dumps({"at": time.time()}), ex=5)
        assert beat_since(client, node, started)
    finally:
        client.delete(node_heartbeat(node))
