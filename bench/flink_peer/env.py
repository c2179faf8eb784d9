"""The Flink environment of the peer benchmark: a virtualenv of its own with PyFlink from PyPI.

PyFlink pins its own pyarrow, pandas and numpy (older than PySpark 4's), so it cannot share the
project's .venv. `.venv-flink` holds apache-flink (whose package ships Flink's scripts, jars and
default configuration: the standalone cluster runs from it) and redis-py. The job's Python
workers run with this interpreter and import the project's `spark_runtime` (Django-free, no
PySpark) through PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FLINK_VERSION = "2.3.0"
REQUIREMENTS = (f"apache-flink=={FLINK_VERSION}", "redis>=5.0,<9")
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VENV = PROJECT_ROOT / ".venv-flink"


@dataclass(frozen=True)
class FlinkEnv:
    """Where the Flink environment's interpreter and Flink's home (pyflink/) are."""

    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def flink_home(self) -> Path:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        return self.venv / "lib" / version / "site-packages" / "pyflink"

    @property
    def stamp(self) -> Path:
        return self.venv / ".installed"


def ensure_flink_env(say=print, venv: Path = DEFAULT_VENV) -> FlinkEnv:
    """Create the Flink virtualenv and install PyFlink unless the same requirements are
    installed already (first time: a few minutes, about 850 MB)."""
    env = FlinkEnv(venv)
    wanted = "\n".join(REQUIREMENTS)
    if env.stamp.exists() and env.stamp.read_text() == wanted and env.flink_home.is_dir():
        say(f"Flink environment: {venv} (apache-flink {FLINK_VERSION})")
        return env
    if not env.python.exists():
        say(f"Flink environment: creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    say(f"Flink environment: installing {', '.join(REQUIREMENTS)} (first time: a few minutes)")
    # Without PYTHONPATH: pip would take the project's own metadata for an installed package.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(env.python), "-m", "pip", "install", "--progress-bar", "on", *REQUIREMENTS],
        check=True,
        env=clean,
    )
    env.stamp.write_text(wanted)
    return env
