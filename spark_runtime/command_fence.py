"""Fenced commands: a receiver (a node agent, a stage process) carries out a controller's command
only while the controller that sent it still holds the job's lease.

A controller holds a job through a lease in Redis (`keys.controller_lease`). Each time any
controller takes a job's lease, the job's tenure number (`keys.controller_tenure`) goes up (to the
later of one more and Redis's clock in microseconds, so it goes up still after Redis lost the
counter with its data), and the lease holds the token `"{owner}#{tenure}"`. Every command the
controller sends for the job (a Celery message to a node agent, an entry on a replica's command
list) carries that token under LEASE_FIELD. A receiver reads the job's lease when the command
arrives and carries it out only when the lease still holds the token, or holds it released
(`RELEASED_PREFIX + token`: the holder gave the job up after sending, as a controller stopping a
job does after its kills, and nobody took it since). A command whose tenure is older than the
newest tenure the receiver saw for the job is refused without looking further: Kleppmann's fencing
tokens, with the lease as the authority. A controller that stalled past its lease (a pause, a long
GC) finds its commands refused, whoever took the job over.

A check and the action after it are two steps: a lease taken over between them would let a
stale command through. So a receiver judges a command with `carrying_out`, which marks the job's
command as in progress in the same step as it reads the lease (`keys.commands_in_progress`), and
clears the mark when the command is carried out; infra/leases.py does not hand a lease to a new
holder while a mark is there. The mark expires after CARRYING_OUT_MS, so a receiver that dies
mid-command holds a takeover back that long at most.

Commands without a token are not a controller's: an operator's fault injection, a stage handing
over to its successor in an upgrade, the standalone runner. They are carried out as before.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from spark_runtime import keys

log = logging.getLogger(__name__)

# The field of a command (a JSON command's key, a Celery task's keyword) that carries the token.
LEASE_FIELD = "lease"
# A lease given up by its holder: free for any controller to take, and its holder's commands
# still count until someone does (they were sent while it held the job).
RELEASED_PREFIX = "released#"
_SEPARATOR = "#"
# How long a receiver's mark of a command in progress holds a lease still at most: starting a
# process or sending a signal takes milliseconds; a receiver that died mid-command lets go then.
CARRYING_OUT_MS = 2000

# Reads the job's lease and, when it holds the command's token (or that token released), marks
# a command in progress: KEYS lease, marks; ARGV token, the released prefix, this mark, its
# expiry (ms). Returns the lease's value.
_READ_AND_MARK = """
local lease = redis.call('get', KEYS[1])
if lease and (lease == ARGV[1] or lease == ARGV[2] .. ARGV[1]) then
  redis.call('sadd', KEYS[2], ARGV[3])
  redis.call('pexpire', KEYS[2], ARGV[4])
end
return lease
"""


def lease_token(owner: str, tenure: int) -> str:
    """The lease value of controller `owner` in its `tenure` of a job."""
    return f"{owner}{_SEPARATOR}{int(tenure)}"


def tenure_of(token: str) -> int:
    """The tenure number a token carries (0 for a malformed one: older than any)."""
    _, _, number = token.rpartition(_SEPARATOR)
    return int(number) if number.isdigit() else 0


def holder_of(lease_value: str | None) -> str | None:
    """The controller a lease value names as holding the job now (None: nobody, or released)."""
    if not lease_value or lease_value.startswith(RELEASED_PREFIX):
        return None
    return lease_value.rpartition(_SEPARATOR)[0] or lease_value


@dataclass(frozen=True)
class Verdict:
    """Whether a receiver carries a command out, and why not when it does not."""

    accepted: bool
    reason: str = ""


def judge(token: str | None, lease_value: str | None, newest_seen: int = 0) -> Verdict:
    """Whether to carry out a command carrying `token` (None: not a controller's) when the job's
    lease holds `lease_value` (None: expired or never taken) and the receiver has seen commands
    of tenure `newest_seen` for the job."""
    if token is None:
        return Verdict(True)
    tenure = tenure_of(token)
    if tenure < newest_seen:
        return Verdict(False, f"tenure {tenure} is older than tenure {newest_seen}, seen before")
    if lease_value in (token, RELEASED_PREFIX + token):
        return Verdict(True)
    if lease_value is None:
        return Verdict(False, f"the lease of tenure {tenure} expired: its sender lost the job")
    return Verdict(False, f"the job's lease is now {lease_value!r}, not the sender's {token!r}")


class FenceMemory:
    """The newest tenure a receiver saw per job; a command of an older one is refused even if
    the lease were lost with Redis's data."""

    def __init__(self):
        self._newest: dict[str, int] = {}

    def newest(self, job: str) -> int:
        """The newest tenure seen for `job` (0: none)."""
        return self._newest.get(job, 0)

    def judge(self, job: str, token: str | None, lease_value: str | None) -> Verdict:
        """`judge` against what this receiver saw of `job`; an accepted command's tenure is
        remembered."""
        verdict = judge(token, lease_value, self.newest(job))
        if verdict.accepted and token is not None:
            self._newest[job] = max(self.newest(job), tenure_of(token))
        return verdict


@contextmanager
def carrying_out(
    client, memory: FenceMemory, job: str, token: str | None, receiver: str, command: str
) -> Iterator[Verdict]:
    """Judge a command of `job` carrying `token` against the job's lease as Redis holds it now,
    and while the body carries an accepted one out, keep the lease from changing hands (a mark
    of the command in progress, cleared at the end). A refusal is logged and put on the
    refused-commands stream (`receiver`: who refused, `command`: what it was, for people
    reading it). No Redis call for a command without a token."""
    if token is None:
        yield Verdict(True)
        return
    marks = keys.commands_in_progress(job)
    mark = f"{receiver} {uuid.uuid4().hex[:12]}"
    lease_value = client.register_script(_READ_AND_MARK)(
        keys=[keys.controller_lease(job), marks],
        args=[token, RELEASED_PREFIX, mark, CARRYING_OUT_MS],
    )
    verdict = memory.judge(job, token, lease_value)
    try:
        if not verdict.accepted:
            report_refusal(client, job, receiver, command, token, verdict.reason)
        yield verdict
    finally:
        client.srem(marks, mark)


def report_refusal(client, job: str, receiver: str, command: str, token: str, reason: str) -> None:
    """Say that `receiver` refused `command` of `job` sent under `token`, and why."""
    log.warning("%s refused %s of %s from %s: %s", receiver, command, job, token, reason)
    client.xadd(
        keys.refused_commands(),
        {"job": job, "receiver": receiver, "command": command, "token": token,
         "reason": reason, "at": str(time.time())},
        maxlen=keys.REFUSED_COMMANDS_MAXLEN,
        approximate=True,
    )  # fmt: skip
