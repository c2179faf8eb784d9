"""A private redis-server (infra.redis_server.PrivateRedis) started with other settings than
append-only persistence: for the system check of the Redis in use, configured each way, and for
a Redis that comes back empty after a crash (no append-only file, no save point)."""

from __future__ import annotations

import subprocess

from infra.launcher import redis_answers, redis_server_binary, wait_for
from infra.redis_server import PrivateRedis


class ConfiguredRedis(PrivateRedis):
    """`persistent=False`: `appendonly no` and no save point (a crash and a start bring it
    back empty); `args`: more redis-server options (e.g. `["--maxmemory", "10mb"]`)."""

    def __init__(self, data_dir, persistent: bool = True, args: list[str] | None = None):
        super().__init__(data_dir)
        self.persistent = persistent
        self.args = list(args or [])

    def start(self) -> None:
        argv = [
            redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "yes" if self.persistent else "no",
            "--appendfsync", "everysec", "--dir", str(self.data_dir), *self.args,
        ]  # fmt: skip
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 (kept open for the child)
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: redis_answers(self.url), 15, f"the private Redis at {self.url}")
