"""A real Backstop cluster for tests: the Celery controller, beat and three node agents as
processes on this machine, sharing the test database and the test Redis.

Used through the `cluster` fixture (tests/conftest.py) by the integration and browser tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil
from django.conf import settings
from django.db import connection

from console.models import Job
from tests.factories import NodeFactory
from web.launcher import agent_argv, agent_env, celery_argv, controller_argv, wait_for
from workers.keys import node_heartbeat
from workers.redis_client import redis_client

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
    """The controller, beat and node agents as real processes, logs under `log_dir`."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "web.settings.test",
            "DATABASE_URL": database_url(),
            "TEST_REDIS_URL": settings.REDIS_URL,
            "CONTROLLER_DISPATCH": "true",
            "BACKSTOP_VAR_DIR": str(log_dir),
        }
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], extra_env: dict | None = None) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 (kept open for the child)
        self.procs[name] = subprocess.Popen(
            argv,
            env={**self.env, **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_controller(self) -> None:
        self.start("controller", controller_argv("it-controller@%h", concurrency=6))

    def start_all(self) -> None:
        """Controller, beat and one agent per node; returns when every agent heartbeats."""
        self.start_controller()
        self.start(
            "beat",
            celery_argv("beat", "--loglevel", "INFO", "--schedule", str(self.log_dir / "beat")),
        )
        for name in NODES:
            self.start(
                f"agent-{name}",
                agent_argv(name, f"it-agent-{name}@%h"),
                extra_env=agent_env(name, mem_mb=8000, cpu=2),
            )
        client = redis_client(decode_responses=False)
        wait_for(lambda: all(client.exists(node_heartbeat(n)) for n in NODES), 90, "node agents")

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop live jobs, then every process, then any stage or generator they left behind."""
        for job in Job.objects.filter(status__in=Job.LIVE_STATUSES):
            job.request_stop("test over")
        time.sleep(3)
        for name in list(self.procs):
            self.kill(name)
        # Stages and generators run in their own sessions (an agent restart must not take them
        # down): end the ones this cluster's agents started, by pid, and nobody else's.
        kill_started_under(self.log_dir)


def kill_started_under(var_dir) -> int:
    """SIGKILL every process whose environment names `var_dir` as its BACKSTOP_VAR_DIR: the
    processes this cluster started and their children (stages, generators), found by pid."""
    marker = str(var_dir)
    ended = 0
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get("BACKSTOP_VAR_DIR") == marker:
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
