"""Work run in a child process (infra/child.py): another process, at nice 10, its exceptions
raised in the caller, ended at its timeout."""

import os
import time

import psutil
import pytest
import redis

from infra.child import BACKGROUND_NICE, ChildTimedOut, run_in_child


def test_the_work_runs_in_another_process_at_a_low_priority():
    assert run_in_child(os.getpid, (), 60) != os.getpid()
    assert run_in_child(os.getpriority, (os.PRIO_PROCESS, 0), 60) == BACKGROUND_NICE


def ping(port: int) -> bool:
    """A Redis ping, in the child."""
    return redis.Redis(port=port, socket_connect_timeout=1).ping()


def test_an_exception_in_the_child_is_raised_in_the_caller():
    with pytest.raises(redis.ConnectionError, match="connecting to localhost:1"):
        run_in_child(ping, (1,), 60)  # nothing listens on port 1


def test_work_past_its_timeout_is_ended_and_leaves_no_process():
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    with pytest.raises(ChildTimedOut, match="sleep ran past 1 s"):
        run_in_child(time.sleep, (60,), 1)
    assert time.monotonic() - started < 30
    left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    assert not [c for c in left if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
