"""Work that a long-lived process (the controller) does now and then, run in a child process of
its own: a new interpreter (spawn), at a low CPU priority, ended at a timeout.

Why not in the process itself:
- memory: a burst of allocations (an output audit reads a job's whole input) leaves Python's
  allocator with arenas that other threads' objects, allocated meanwhile, keep from being
  returned, so the process's RSS steps up and stays there (the soak's controller, docs/RESULTS.md);
  modules imported once (scikit-learn) stay for the process's life too;
- CPU: the controller runs above the stages (CONTROL_PLANE_NICE), and this work can wait for a
  recovery.

The child gets its arguments pickled and returns its result pickled, so it is given plain data
(no database connection, no Redis client) and imports only the modules of the function it runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from multiprocessing import TimeoutError as PoolTimeout
from multiprocessing import get_context
from typing import Any

# The child's nice level: below the stages (0) and the control plane.
BACKGROUND_NICE = 10


class ChildTimedOut(RuntimeError):
    """The child ran past its timeout and was ended."""


def run_in_child(
    function: Callable[..., Any], args: tuple, timeout_s: float, nice: int = BACKGROUND_NICE
) -> Any:
    """`function(*args)` in a new process at `nice`; its result, or its exception raised here.
    Raises ChildTimedOut after `timeout_s`; the pool's exit terminates the child, so none is
    left behind."""
    with get_context("spawn").Pool(
        1, initializer=os.setpriority, initargs=(os.PRIO_PROCESS, 0, nice)
    ) as pool:
        try:
            return pool.apply_async(function, args).get(timeout=timeout_s)
        except PoolTimeout as exc:
            raise ChildTimedOut(
                f"{function.__qualname__} ran past {timeout_s:g} s and was ended"
            ) from exc
