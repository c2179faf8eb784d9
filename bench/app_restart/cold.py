"""The cold baseline: an app kept alive by a plain `spark-submit` loop (no Backstop).

What a team without a supervisor runs: the installed PySpark's own `spark-submit` starts the
app's file, and a loop starts it again as soon as it ends, for whatever reason. Every start is
cold: a JVM, a SparkSession, the app's imports, then its queries resume from their checkpoints.
The session gets the same Spark settings as Backstop's stages (spark_runtime.config.SPARK_CONF,
on the same master), but none of Backstop's mechanisms (no class-data archive, no warm spare).
No Django here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from spark_runtime.config import SPARK_CONF, spark_master, worker_python

# How soon the loop starts the app again after it ended (a shell loop's `sleep 0`: at once).
RESTART_DELAY_S = 0.0


def spark_submit() -> str:
    """The `spark-submit` of the PySpark installed beside this interpreter."""
    path = Path(sys.executable).parent / "spark-submit"
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no spark-submit at {path}: is PySpark installed in this venv?")
    return str(path)


def submit_command(app_file: Path, args: list[str]) -> list[str]:
    """`spark-submit --master M --conf K=V ... APP ARGS`: the app with Backstop's session
    settings, submitted as anyone would."""
    command = [spark_submit(), "--master", spark_master()]
    for key, value in SPARK_CONF.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, str(app_file), *args]


class SparkSubmitLoop:
    """Runs `submit_command` again each time it ends, until `stop()`; `kill()` SIGKILLs the
    running one (its process group: the launcher, the JVM and the app's Python)."""

    def __init__(self, app_file: Path, args: list[str], log_path: Path):
        self.command = submit_command(app_file, args)
        self.log_path = log_path
        self.starts: list[float] = []  # when each spark-submit started
        self.current: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="spark-submit-loop", daemon=True)

    def start(self) -> None:
        """Start the loop (returns at once)."""
        self.thread.start()

    def _loop(self) -> None:
        env = {
            **os.environ,
            "PYSPARK_PYTHON": worker_python(),
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            while not self.stopping.is_set():
                with self.lock:
                    self.current = subprocess.Popen(
                        self.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                        start_new_session=True,
                    )  # fmt: skip
                    self.starts.append(time.time())
                self.current.wait()
                self.stopping.wait(RESTART_DELAY_S)

    def pid(self) -> int | None:
        """The running spark-submit's pid (None between two starts)."""
        with self.lock:
            current = self.current
        return current.pid if current is not None and current.poll() is None else None

    def kill(self) -> float:
        """SIGKILL the running app and its children; returns when (epoch seconds)."""
        with self.lock:
            current = self.current
        if current is None or current.poll() is not None:
            raise RuntimeError("the app is not running: nothing to kill")
        at = time.time()
        os.killpg(current.pid, signal.SIGKILL)
        return at

    def stop(self) -> None:
        """End the loop and the running app (SIGTERM, then SIGKILL after 20 s)."""
        self.stopping.set()
        with self.lock:
            current = self.current
        if current is not None and current.poll() is None:
            os.killpg(current.pid, signal.SIGTERM)
            try:
                current.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(current.pid, signal.SIGKILL)
        self.thread.join(30)
