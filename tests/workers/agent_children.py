"""Cleaning up after tests that let the node agent start (stand-in) stage processes."""

import contextlib
import os
import signal

from workers import agent


def kill_children_of(jobs: set[str]) -> None:
    """Forget the agent's children of `jobs` and kill their process groups (SIGKILL), waiting
    for each to end, so the next test starts with none of them."""
    with agent._children_lock:
        ours = {k: v for k, v in agent._children.items() if k[0] in jobs}
        for key in ours:
            del agent._children[key]
            agent._became_replica_at.pop(key, None)
    for popen, _job, _path in ours.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
