"""Per-job supervision leases and controller membership, in Redis.

A controller process supervises a job only while it holds the job's lease: a key holding the token
of the controller's tenure of the job (its name and a number that goes up with every taking, even
across a Redis that lost its data: spark_runtime.command_fence) with a short expiry, renewed for
all its jobs in one round trip. Every command it sends for the job carries the token, and receivers
refuse it once the lease holds another. A controller that dies stops renewing, its leases expire
and the others take the jobs over, each as soon as no receiver is carrying out a command of the old
holder (spark_runtime.command_fence.carrying_out). Every write of a job's supervision state is a
compare-and-set on the lease (`replace_if_held`, `delete_if_held`), so a controller that stalled
past its lease cannot overwrite its successor's state.

Membership: each live controller scores itself in a sorted set every renewal; the live ones
split the live jobs between them (`fair_share`), so adding a controller adds capacity.
"""

from __future__ import annotations

import math
import time

from infra import keys
from spark_runtime.command_fence import RELEASED_PREFIX, holder_of

# Takes a free lease (none, or one its holder released) under a new tenure, unless a receiver
# is carrying out a command of the job's last holder (command_fence.carrying_out): KEYS lease,
# tenure, commands in progress; ARGV owner, ttl ms, the released prefix. Returns the token
# (command_fence.lease_token).
# The new tenure is the later of the last one plus one and Redis's clock in microseconds, not a
# count from 1: receivers remember the newest tenure they obeyed (command_fence.FenceMemory), so
# after a Redis that lost its data a count from 1 again would have every controller's command
# refused as older than one seen before, and could hand a controller a token it held before.
# Microseconds, not milliseconds: a job's lease taken several times within a millisecond (each
# taking is a script run of some microseconds) would put the count ahead of a millisecond clock,
# and a taking just after the loss could then get a tenure already given.
_ACQUIRE = """
local current = redis.call('get', KEYS[1])
if current and string.sub(current, 1, string.len(ARGV[3])) ~= ARGV[3] then return false end
if redis.call('exists', KEYS[3]) == 1 then return false end
local now = redis.call('time')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local tenure = math.max(tonumber(redis.call('get', KEYS[2]) or '0') + 1, now_us)
local number = string.format('%.0f', tenure)
redis.call('set', KEYS[2], number)
local token = ARGV[1] .. '#' .. number
redis.call('set', KEYS[1], token, 'PX', ARGV[2])
return token
"""
# KEYS the leases; ARGV ttl ms, then each lease's token. Returns the leases no longer held.
_RENEW = """
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('get', key) == ARGV[i + 1] then
    redis.call('pexpire', key, ARGV[1])
  else
    table.insert(lost, key)
  end
end
return lost
"""
# KEYS lease; ARGV token, the released prefix, how long the released lease is kept (ms).
_RELEASE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('set', KEYS[1], ARGV[2] .. ARGV[1], 'PX', ARGV[3])
return 1
"""
# KEYS lease, key; ARGV token, value, whether to create a missing key ('1') or not ('0').
_REPLACE_IF_HELD = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[3] == '1' then redis.call('set', KEYS[2], ARGV[2])
else redis.call('set', KEYS[2], ARGV[2], 'XX') end
return 1
"""
_DELETE_IF_HELD = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('del', unpack(KEYS, 2))
return 1
"""
# A released lease is kept this long: the commands its holder sent before it gave the job up
# (the kills of a stop) still count while they wait in a queue (the longest expiry of an
# agent's task is 60 s, infra/tasks.py).
RELEASED_KEEP_S = 120.0


class Leases:
    """The leases one controller (`owner`, a name unique to the process) holds, each with the
    token of its tenure (spark_runtime.command_fence), which every command it sends for the job
    carries."""

    def __init__(self, client, owner: str, ttl_s: float):
        self.client = client
        self.owner = owner
        self.ttl_ms = int(ttl_s * 1000)
        self._tokens: dict[str, str] = {}
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)

    def try_acquire(self, job_key: str) -> str | None:
        """Take the job's lease if nobody holds it (a released one is free), under a new tenure;
        returns the token of that tenure, None when another controller holds it."""
        return self._tokens[job_key] if self.try_acquire_all([job_key]) else None

    def try_acquire_all(self, job_keys: list[str]) -> list[str]:
        """Take the leases of `job_keys` that nobody holds, each under a new tenure, in one
        round trip (a controller taking a dead one's jobs takes dozens at once); returns the
        jobs taken, in the order given."""
        if not job_keys:
            return []
        pipe = self.client.pipeline(transaction=False)
        for job_key in job_keys:
            self._acquire(
                keys=[
                    keys.controller_lease(job_key),
                    keys.controller_tenure(job_key),
                    keys.commands_in_progress(job_key),
                ],
                args=[self.owner, self.ttl_ms, RELEASED_PREFIX],
                client=pipe,
            )
        taken = []
        for job_key, token in zip(job_keys, pipe.execute(), strict=True):
            if token is not None:
                self._tokens[job_key] = token
                taken.append(job_key)
        return taken

    def token(self, job_key: str) -> str | None:
        """The token of our tenure of the job (None: we never took it, or gave it up)."""
        return self._tokens.get(job_key)

    def renew(self, job_keys: list[str]) -> set[str]:
        """Extend the leases of `job_keys`; returns the jobs whose lease is no longer ours."""
        held = [k for k in job_keys if k in self._tokens]
        lost = {k for k in job_keys if k not in self._tokens}
        if not held:
            return lost
        lease_keys = [keys.controller_lease(k) for k in held]
        gone = set(self._renew(keys=lease_keys, args=[self.ttl_ms, *map(self._tokens.get, held)]))
        return lost | {k for k, lease in zip(held, lease_keys, strict=True) if lease in gone}

    def holds(self, job_key: str) -> bool:
        """Whether the job's lease is still ours (checked before acting on the job)."""
        token = self._tokens.get(job_key)
        return token is not None and self.client.get(keys.controller_lease(job_key)) == token

    def release(self, job_key: str) -> None:
        """Give the job's lease up at once (only if still ours), for another to take; the
        commands we sent under it still count until someone does."""
        token = self._tokens.pop(job_key, None)
        if token is not None:
            self._release(
                keys=[keys.controller_lease(job_key)],
                args=[token, RELEASED_PREFIX, int(RELEASED_KEEP_S * 1000)],
            )

    def forget(self, job_key: str) -> None:
        """The job's lease is no longer ours (lost to another): its token is not used again."""
        self._tokens.pop(job_key, None)

    def replace_if_held(self, job_key: str, key: str, value: str, create: bool = False) -> bool:
        """Overwrite `key` with `value` only while the job's lease is ours (returns whether it
        is); a `key` that does not exist (deleted on purpose, as a stopped job's state) is not
        created again unless `create` (a job's first state, written at its launch)."""
        token = self._tokens.get(job_key)
        return token is not None and replace_if_token(
            self.client, job_key, token, key, value, create
        )

    def delete_if_held(self, job_key: str, *doomed: str) -> bool:
        """Delete the keys `doomed` only while the job's lease is ours (returns whether it is)."""
        token = self._tokens.get(job_key)
        return token is not None and delete_if_token(self.client, job_key, token, *doomed)

    def holders(self, job_keys: list[str]) -> dict[str, str | None]:
        """Who holds each job's lease (None: nobody), in one round trip."""
        return holders(self.client, job_keys)


def replace_if_token(
    client, job_key: str, token: str, key: str, value: str, create: bool = False
) -> bool:
    """Set `key` to `value` only while the job's lease holds `token`, in one step (returns
    whether it did); a missing `key` is created only with `create`."""
    script = client.register_script(_REPLACE_IF_HELD)
    lease = keys.controller_lease(job_key)
    return bool(script(keys=[lease, key], args=[token, value, int(create)]))


def delete_if_token(client, job_key: str, token: str, *doomed: str) -> bool:
    """Delete the keys `doomed` only while the job's lease holds `token` (returns whether it
    did)."""
    script = client.register_script(_DELETE_IF_HELD)
    return bool(script(keys=[keys.controller_lease(job_key), *doomed], args=[token]))


def holders(client, job_keys: list[str]) -> dict[str, str | None]:
    """Which controller holds each job's lease (None: nobody, or its holder released it), in
    one round trip."""
    if not job_keys:
        return {}
    values = client.mget([keys.controller_lease(k) for k in job_keys])
    return {k: holder_of(v) for k, v in zip(job_keys, values, strict=True)}


def expired(client, job_keys: list[str]) -> set[str]:
    """The jobs among `job_keys` whose lease ran out: none is held or released now, yet the job
    was taken before (its tenure counter exists). Their controller died or stalled; a job never
    taken (just launched) or given up (released) is not among them. One round trip."""
    if not job_keys:
        return set()
    lease_keys = [keys.controller_lease(k) for k in job_keys]
    tenure_keys = [keys.controller_tenure(k) for k in job_keys]
    values = client.mget(lease_keys + tenure_keys)
    leases_now, tenures = values[: len(job_keys)], values[len(job_keys) :]
    return {
        k
        for k, lease, tenure in zip(job_keys, leases_now, tenures, strict=True)
        if lease is None and tenure is not None
    }


def heartbeat(client, owner: str) -> None:
    """Say that controller `owner` is alive now."""
    client.zadd(keys.controllers(), {owner: time.time()})


def live_controllers(client, ttl_s: float) -> list[str]:
    """The controllers that said they are alive within `ttl_s`; older entries are removed."""
    now = time.time()
    client.zremrangebyscore(keys.controllers(), "-inf", now - 10 * ttl_s)
    return sorted(client.zrangebyscore(keys.controllers(), now - ttl_s, "+inf"))


def leave(client, owner: str) -> None:
    """Controller `owner` stops: the others stop counting it at once."""
    client.zrem(keys.controllers(), owner)


def fair_share(live_jobs: int, live_controllers: int) -> int:
    """How many jobs one controller takes: an even split, rounded up (never 0 while jobs run)."""
    return math.ceil(live_jobs / max(1, live_controllers))
