"""A redis-server of a caller's own on a free port, with append-only persistence, which the caller
can crash and start again on the same data: the tests of Redis outages (tests/redis_server.py
re-exports it) and `manage.py soak`, which restarts its Redis during a run. No Django imports."""

from __future__ import annotations

import signal
import socket
import subprocess
from pathlib import Path

from infra.launcher import redis_answers, redis_server_binary, wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivateRedis:
    """A redis-server with append-only persistence (fsync every second, Redis's default) that
    its owner can crash and start again on the same data directory."""

    def __init__(self, data_dir: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        argv = [
            redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
            "--dir", str(self.data_dir),
        ]  # fmt: skip
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 (kept open for the child)
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: redis_answers(self.url), 15, f"the private Redis at {self.url}")

    def crash(self) -> None:
        """SIGKILL: no shutdown save; what survives is what the append-only file holds."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.crash()
