"""A real Backstop cluster for tests: the Celery controller, beat and three node agents as
processes on this machine, sharing the test database and the test Redis.

Used through the `cluster` fixture (tests/conftest.py) by the integration and browser tests.
"""

from __future__ import annotations

import time

import psutil
from django.conf import settings
from django.db import connection

from console.models import Job
from console.redis import redis_client
from infra.launcher import LocalCluster
from infra.process_group import ProcessGroup
from infra.processes import processes_with_env
from tests.factories import NodeFactory

NODES = ("node-1", "node-2", "node-3")


def database_url() -> str:
    """The test database, spelled for the worker processes."""
    conf = connection.settings_dict
    if conf["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{conf['NAME']}"
    user = conf.get("USER") or "postgres"
    host, port = conf.get("HOST") or "127.0.0.1", conf.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{conf['NAME']}"


class Cluster:
    """The controller, beat and node agents as real processes (infra.launcher.LocalCluster, so a
    process that exits on its own is started again), logs under `log_dir`.

    redis_url: the Redis the workers use (default: the test Redis); env: added to every
    process's environment (e.g. SPARK_MASTER, which the stage processes inherit); own_hosts:
    each node stands for a host of its own (LocalCluster.own_hosts).
    """

    def __init__(
        self,
        log_dir,
        redis_url: str | None = None,
        env: dict | None = None,
        own_hosts: bool = False,
    ):
        self.log_dir = log_dir
        self.redis_url = redis_url or settings.REDIS_URL
        self.group = ProcessGroup(log_dir, say=None)  # restarts go to log_dir/launcher.log
        self.workers = LocalCluster(
            self.group,
            NODES,
            node_mem_mb=8000,
            node_cpu=2,
            beat_schedule=log_dir / "beat",
            worker_prefix="it-",
            controller_concurrency=6,
            own_hosts=own_hosts,
            env={
                "DJANGO_SETTINGS_MODULE": "web.settings.test",
                "DATABASE_URL": database_url(),
                "TEST_REDIS_URL": self.redis_url,
                "CONTROLLER_DISPATCH": "true",
                "BACKSTOP_VAR_DIR": str(log_dir),
                **(env or {}),
            },
        )

    def start_controller(self) -> None:
        self.workers.start_controller()

    def start_all(self) -> None:
        """Controller, beat and one agent per node; returns when every agent heartbeats."""
        self.workers.start(self.redis_url)

    def kill(self, name: str) -> None:
        """SIGKILL one of the cluster's processes ("controller", "beat", "agent-node-1"...)."""
        self.group.kill(name)

    def restarts(self) -> str:
        """What the launcher restarted on its own (its log), "" if nothing."""
        log = self.log_dir / "launcher.log"
        return log.read_text() if log.exists() else ""

    def stop(self) -> None:
        """Stop live jobs, then every process, then any stage or generator they left behind."""
        for job in Job.objects.filter(status__in=Job.LIVE_STATUSES):
            job.request_stop("test over")
        time.sleep(3)
        self.group.stop(grace_s=0)
        # Stages and generators run in their own sessions (an agent restart must not take them
        # down): end the ones this cluster's agents started, by pid, and nobody else's.
        kill_started_under(self.log_dir)


def kill_started_under(var_dir) -> int:
    """SIGKILL every process whose environment names `var_dir` as its BACKSTOP_VAR_DIR: the
    processes this cluster started and their children (stages, generators), found by pid."""
    ended = 0
    for proc in processes_with_env("BACKSTOP_VAR_DIR", str(var_dir)):
        try:
            proc.kill()
            ended += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return ended


def prepare() -> None:
    """Nodes, schedules and a clean Redis (the test Redis database is this run's own)."""
    from console.services.schedules import ensure_periodic_tasks

    redis_client(decode_responses=False).flushdb()
    ensure_periodic_tasks()
    for name in NODES:
        NodeFactory(name=name, cpu_total=2.0, mem_total_mb=8000.0)
