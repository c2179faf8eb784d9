"""Cleaning up after tests that let the node agent start (stand-in) stage processes."""

import contextlib
import os
import signal

from workers.node import children


def kill_children_of(jobs: set[str]) -> None:
    """Forget the agent's children of `jobs` and kill their process groups (SIGKILL), waiting
    for each to end, so the next test starts with none of them."""
    with children._children_lock:
        ours = {k: v for k, v in children._children.items() if k[0] in jobs}
        for key in ours:
            del children._children[key]
            children._became_replica_at.pop(key, None)
    for popen, _job, _path in ours.values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
