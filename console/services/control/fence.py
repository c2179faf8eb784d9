"""Fenced acting: a thread acts on a job under the token of its lease on the job
(`acting_under`, set by the fleet's reconcile and by a launch). Every command it sends carries
that token (`lease_fields`), and the agents and stages refuse one whose token the job's lease no
longer holds (spark_runtime.command_fence). The writes of the job's control state go through
`write_state` and `delete_state`: compare-and-set on the same lease (infra/leases.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from infra import leases
from spark_runtime.command_fence import LEASE_FIELD

# The token of the lease under which this thread acts on a job now (None: a test or a tool
# acting on its own, whose commands are not a controller's).
_acting_lease: ContextVar[str | None] = ContextVar("backstop_acting_lease", default=None)


class LeaseLost(Exception):
    """A fenced write found the job's lease held by another: this thread must stop acting."""


@contextmanager
def acting_under(token: str | None) -> Iterator[None]:
    """Act on a job under lease `token`: every command sent and every state written within
    carries or checks it."""
    reset = _acting_lease.set(token)
    try:
        yield
    finally:
        _acting_lease.reset(reset)


def lease_fields() -> dict[str, str]:
    """What a command carries of the lease this thread acts under ({} outside one)."""
    token = _acting_lease.get()
    return {} if token is None else {LEASE_FIELD: token}


def write_state(client, job_key: str, key: str, value: str, create: bool = False) -> None:
    """Write a key of the job's control state (its supervision state, its events cursor) as the
    holder of its lease; raises LeaseLost when the lease is another's. `create`: a missing key
    is created (a launch's first state), else it is left missing (a stopped job's)."""
    token = _acting_lease.get()
    if token is None:
        if create or client.exists(key):
            client.set(key, value)
        return
    if not leases.replace_if_token(client, job_key, token, key, value, create):
        raise LeaseLost(f"the lease of {job_key} is no longer {token}")


def delete_state(client, job_key: str, *doomed: str) -> None:
    """Delete keys of the job's control state as the holder of its lease; raises LeaseLost
    when the lease is another's."""
    token = _acting_lease.get()
    if token is None:
        client.delete(*doomed)
    elif not leases.delete_if_token(client, job_key, token, *doomed):
        raise LeaseLost(f"the lease of {job_key} is no longer {token}")
