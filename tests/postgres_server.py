"""A PostgreSQL server of a test's own, which the test can crash and start again: for the test of
a database restart under a running job (the machine's server serves others; it is never
restarted by a test).

The server runs from the machine's PostgreSQL binaries (Debian's postgresql package) on a
free port, with its data in a fresh directory. PostgreSQL refuses to run as root, so as root
its commands run as the `postgres` user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg2
from django.core.management import call_command
from django.db import connections
from django.db.utils import load_backend

from tests.redis_server import free_port
from web.settings.base import database_settings

DATABASE_NAME = "backstop"


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(candidates[-1]).parent if candidates else None


class PrivatePostgres:
    """initdb into a fresh directory, then a server on 127.0.0.1 and a free port, trust auth,
    one database (`backstop`). `crash()` stops it the way a crash does (`pg_ctl stop -m
    immediate`: every session ended, no shutdown checkpoint) and `start()` starts it again on
    the same data, which PostgreSQL recovers from its write-ahead log."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        # Not under pytest's tmp_path: the postgres user cannot enter root's private folders.
        self.root = Path(tempfile.mkdtemp(prefix="backstop-pg-"))
        self.data_dir = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE_NAME}"
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
            os.chmod(self.root, 0o755)

    def _run(self, *argv: str) -> None:
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def create(self) -> None:
        """initdb, start, and create the database."""
        self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--no-sync")  # fmt: skip
        self.start()
        admin = psycopg2.connect(
            dbname="postgres", user="postgres", host="127.0.0.1", port=self.port
        )
        admin.autocommit = True
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        admin.close()

    def start(self) -> None:
        """Start the server and return once it takes connections (pg_ctl -w)."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log), "-o", options,
                  "-w", "-t", "60", "start")  # fmt: skip

    def crash(self) -> None:
        """Stop as a crash does: every backend ended at once, recovery at the next start."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")

    def destroy(self) -> None:
        """Stop the server if it runs, and delete its data."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self.crash()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def default_database(url: str):
    """Point this process's `default` database connection at `url` (migrated first) for the
    block, then back: so a test's ORM calls and the workers it starts share that database.
    The settings are the product's own (web.settings.base.database_settings)."""
    original = connections["default"]
    conf = connections.configure_settings({"default": database_settings(url)})
    replacement = load_backend(conf["default"]["ENGINE"]).DatabaseWrapper(
        conf["default"], "default"
    )
    connections["default"] = replacement
    try:
        call_command("migrate", verbosity=0, interactive=False)
        yield replacement
    finally:
        replacement.close()
        connections["default"] = original
