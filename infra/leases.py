"""Per-job supervision leases and controller membership, in Redis.

A controller process supervises a job only while it holds the job's lease: a key holding the
controller's token with a short expiry, renewed for all its jobs in one round trip. A controller
that dies stops renewing, its leases expire and the others take the jobs over. Writes that must
come from the holder only (the supervision state) go through `replace_if_held`, a compare-and-set on
the lease, so a controller that stalled past its lease cannot overwrite its successor's state.

Membership: each live controller scores itself in a sorted set every renewal; the live ones
split the live jobs between them (`fair_share`), so adding a controller adds capacity.
"""

from __future__ import annotations

import math
import time

from infra import keys

_RENEW = """
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('get', key) == ARGV[1] then
    redis.call('pexpire', key, ARGV[2])
  else
    table.insert(lost, key)
  end
end
return lost
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
_REPLACE_IF_HELD = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('set', KEYS[2], ARGV[2], 'XX')
return 1
"""


class Leases:
    """The leases one controller (`owner`, a token unique to the process) holds."""

    def __init__(self, client, owner: str, ttl_s: float):
        self.client = client
        self.owner = owner
        self.ttl_ms = int(ttl_s * 1000)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._replace_if_held = client.register_script(_REPLACE_IF_HELD)

    def try_acquire(self, job_key: str) -> bool:
        """Take the job's lease if nobody holds it."""
        return bool(
            self.client.set(keys.controller_lease(job_key), self.owner, nx=True, px=self.ttl_ms)
        )

    def renew(self, job_keys: list[str]) -> set[str]:
        """Extend the leases of `job_keys`; returns the jobs whose lease is no longer ours."""
        if not job_keys:
            return set()
        lease_keys = [keys.controller_lease(k) for k in job_keys]
        lost = set(self._renew(keys=lease_keys, args=[self.owner, self.ttl_ms]))
        return {k for k, lease in zip(job_keys, lease_keys, strict=True) if lease in lost}

    def holds(self, job_key: str) -> bool:
        """Whether the job's lease is still ours (checked before acting on the job)."""
        return self.client.get(keys.controller_lease(job_key)) == self.owner

    def release(self, job_key: str) -> None:
        """Give the job's lease up at once (only if still ours), for another to take."""
        self._release(keys=[keys.controller_lease(job_key)], args=[self.owner])

    def replace_if_held(self, job_key: str, key: str, value: str) -> bool:
        """Overwrite `key` with `value` only while the job's lease is ours (returns whether it
        is); a `key` that does not exist (deleted on purpose, as a stopped job's state) is not
        created again."""
        lease = keys.controller_lease(job_key)
        return bool(self._replace_if_held(keys=[lease, key], args=[self.owner, value]))

    def holders(self, job_keys: list[str]) -> dict[str, str | None]:
        """Who holds each job's lease (None: nobody), in one round trip."""
        return holders(self.client, job_keys)


def holders(client, job_keys: list[str]) -> dict[str, str | None]:
    """Who holds each job's lease (None: nobody), in one round trip."""
    if not job_keys:
        return {}
    values = client.mget([keys.controller_lease(k) for k in job_keys])
    return dict(zip(job_keys, values, strict=True))


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
