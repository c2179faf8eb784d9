"""A replica's start on this node: the process already running it is kept (a start is
idempotent), the one just killed for a restart is waited for, and a new one is a warm spare
taking the replica when the node has one, else a cold process."""

from __future__ import annotations

from infra.processes import STAGE_MODULE
from workers.node import children, spares


def start(module: str, args: list[str], replica_id: str, job_key: str, warm: bool) -> int:
    """The pid of the process running replica `replica_id` of job `job_key` (`python -m module
    args...`), started unless it runs; with `warm`, a stage replica takes over a warm spare of
    this node when there is one (no JVM start)."""
    pid = children.already_running(replica_id, job_key)
    if pid is not None:
        return pid
    if warm and module == STAGE_MODULE:
        pid = spares.hand_to_spare(args, replica_id, job_key)
        if pid is not None:
            return pid
    return children.start_child(module, args, replica_id, job_key)
