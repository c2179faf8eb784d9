"""A Spark standalone cluster of a test's own, started from the pip package's `spark-class`
(no Docker, no download): one master and N workers on this machine, each a JVM the test can
kill, stopped by pid at the end."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import psutil

from infra.launcher import wait_for
from tests.redis_server import free_port


def spark_home() -> Path:
    """The Spark distribution inside the pyspark package (bin/spark-class, jars/)."""
    import pyspark

    return Path(pyspark.__file__).parent


class SparkStandalone:
    """`workers` Spark workers of `cores` (virtual) cores each behind one master, logs and work
    directories under `base_dir`. `url` is the master's (spark://127.0.0.1:PORT)."""

    def __init__(self, base_dir: Path, workers: int = 2, cores: int = 4, memory: str = "4g"):
        self.base_dir = base_dir
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.worker_count, self.cores, self.memory = workers, cores, memory
        self.procs: dict[str, subprocess.Popen] = {}

    def _start(self, name: str, argv: list[str], env: dict | None = None) -> None:
        log = open(self.base_dir / f"{name}.log", "ab")  # noqa: SIM115 (kept open for the child)
        self.procs[name] = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SPARK_HOME": str(spark_home()), **(env or {})},
            start_new_session=True,
        )

    def start(self, timeout_s: float = 90) -> None:
        """Start the master, then the workers; return once every worker is registered."""
        self._start(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
             "--port", str(self.port), "--webui-port", str(self.ui_port)],
        )  # fmt: skip
        for index in range(1, self.worker_count + 1):
            work_dir = self.base_dir / f"worker-{index}"
            work_dir.mkdir(exist_ok=True)
            self._start(
                f"worker-{index}",
                ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                 "--cores", str(self.cores), "--memory", self.memory,
                 "--webui-port", str(free_port()), "--work-dir", str(work_dir)],
            )  # fmt: skip
        wait_for(
            lambda: len(self.alive_workers()) == self.worker_count,
            timeout_s,
            f"{self.worker_count} Spark workers registered (logs in {self.base_dir})",
        )

    def state(self) -> dict:
        """The master's view of the cluster (its web UI's JSON: workers, apps); {} if down."""
        try:
            url = f"http://127.0.0.1:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310 (local URL)
                return json.load(response)
        except OSError:
            return {}

    def alive_workers(self) -> list[dict]:
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def worker_pids(self) -> dict[str, int]:
        """The pids of the workers still running, by name."""
        return {
            name: proc.pid
            for name, proc in self.procs.items()
            if name.startswith("worker-") and proc.poll() is None
        }

    def stop(self) -> None:
        """SIGKILL the master, the workers and everything they started (executors), by pid."""
        for proc in self.procs.values():
            try:
                tree = psutil.Process(proc.pid)
                victims = [tree, *tree.children(recursive=True)]
            except psutil.NoSuchProcess:
                victims = []  # killed by the test, and reaped
            for victim in victims:
                try:
                    victim.kill()
                except psutil.NoSuchProcess:
                    continue
            proc.wait(timeout=10)
