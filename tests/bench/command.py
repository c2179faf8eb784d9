"""Running `manage.py bench` (or `bench_upgrade`) as a user would, for the slow benchmark
tests: in its own process, on a fresh SQLite database and Redis db 13 (flushed first)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from infra.redis_client import redis_client

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/13"


def run_bench_command(
    tmp_path: Path,
    *options: str,
    timeout_s: float,
    command: str = "bench",
    result: str = "bench.json",
) -> dict:
    """Run `manage.py COMMAND OPTIONS --out TMP/out` (`bench` by default); returns the JSON
    file `result` it wrote there (the command must succeed)."""
    redis_client(REDIS_URL, decode_responses=False).flushdb()
    out = tmp_path / "out"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "web.settings.local",
        "BACKSTOP_VAR_DIR": str(tmp_path / "var"),
        "REDIS_URL": REDIS_URL,
    }
    env.pop("DATABASE_URL", None)  # the command's own SQLite file, as a user's first run
    done = subprocess.run(
        [sys.executable, "manage.py", command, *options, "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / result).read_text())
