"""The fleet's own PostgreSQL and Redis, and this process's Django pointed at them.

A PostgreSQL server of the run's own (initdb into a temporary directory, a free port) means the
database's counters count the fleet's queries and nobody else's; it loads pg_stat_statements, so
the queries are counted one by one (utility statements such as BEGIN and SET left out). The
tests' private server (tests/postgres_server.py) is this one too. A private redis-server on
a free port, with keyspace notifications for lists on (the simulated stages learn of a control
command the moment it is pushed, as a real stage's BLPOP does).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import dj_database_url
import psycopg2
from celery import current_app
from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.db.utils import load_backend
from django.test.utils import override_settings

from infra.launcher import redis_answers, redis_server_binary, wait_for

DATABASE_NAME = "backstop"
# Keyspace events: K (the __keyspace@db__:key channel) for l (list commands).
KEYSPACE_EVENTS = "Kl"
METRICS_TOKEN = "fleet-sim-metrics"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(candidates[-1]).parent if candidates else None


def postgres_available() -> str | None:
    """Why a private PostgreSQL cannot be started here, or None when it can."""
    if postgres_bin_dir() is None:
        return "the PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run PostgreSQL as"
    return None


class PrivatePostgres:
    """initdb into a fresh directory, a server on 127.0.0.1 and a free port, trust auth, one
    database (`backstop`) with pg_stat_statements when the server has it. As root its commands
    run as the `postgres` user (PostgreSQL refuses to run as root). `crash()` stops it the way a
    crash does (`pg_ctl stop -m immediate`: every session ended, no shutdown checkpoint) and
    `start()` starts it again on the same data, which PostgreSQL recovers from its write-ahead
    log (the control-plane outage tests use both)."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        # Not under a private folder of root's: the postgres user must enter it.
        self.root = Path(tempfile.mkdtemp(prefix="backstop-fleet-pg-"))
        self.data_dir = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE_NAME}"
        self.as_root = os.geteuid() == 0
        self.statements = False  # pg_stat_statements loaded and created
        self.preload = False  # whether the server loads pg_stat_statements at start
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
            os.chmod(self.root, 0o755)

    def _run(self, *argv: str) -> None:
        command = [str(self.bin_dir / argv[0]), *argv[1:]]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def _has_statements_library(self) -> bool:
        lib = subprocess.run(
            [str(self.bin_dir / "pg_config"), "--pkglibdir"], capture_output=True, text=True
        )
        libdir = lib.stdout.strip() if lib.returncode == 0 else str(self.bin_dir.parent / "lib")
        return Path(libdir, "pg_stat_statements.so").exists()

    def create(self) -> None:
        """initdb, start, create the database (and the pg_stat_statements extension)."""
        self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "-A", "trust",
                  "-E", "UTF8", "--no-sync")  # fmt: skip
        preload = self.preload = self._has_statements_library()
        self.start()
        admin = psycopg2.connect(
            dbname="postgres", user="postgres", host="127.0.0.1", port=self.port
        )
        admin.autocommit = True
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
        admin.close()
        if preload:
            conn = psycopg2.connect(
                dbname=DATABASE_NAME, user="postgres", host="127.0.0.1", port=self.port
            )
            conn.autocommit = True
            with conn.cursor() as cursor:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.close()
            self.statements = True

    def start(self) -> None:
        """Start the server and return once it takes connections (pg_ctl -w)."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
        options += " -c max_connections=300"
        if self.preload:
            # Queries only: BEGIN, COMMIT, SET and SAVEPOINT are not what the fleet asks for.
            options += (
                " -c shared_preload_libraries=pg_stat_statements"
                " -c pg_stat_statements.track=top -c pg_stat_statements.track_utility=off"
            )
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log), "-o", options,
                  "-w", "-t", "60", "start")  # fmt: skip

    def crash(self) -> None:
        """Stop as a crash does: every backend ended at once, recovery at the next start."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")

    def destroy(self) -> None:
        """Stop the server if it runs, and delete its data."""
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.crash()
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A redis-server of the fleet's own on a free port: no persistence (nothing of a run needs
    to survive it), keyspace notifications for lists on."""

    def __init__(self, data_dir: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.data_dir = data_dir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(self.data_dir),
            "--notify-keyspace-events", KEYSPACE_EVENTS, "--maxclients", "10000",
        ]  # fmt: skip
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 (kept open for the child)
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(lambda: redis_answers(self.url), 15, f"the fleet's Redis at {self.url}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass(frozen=True)
class Services:
    """Where the fleet's Redis and database are: `redis_url` and `database_url` as the
    controller processes are given them (environment), `private_database` when it is the run's
    own (so it may be emptied between the sizes of a curve), `private_redis` likewise."""

    redis_url: str
    database_url: str
    private_database: bool = False
    private_redis: bool = False


def database_url_of_default() -> str:
    """The database this process uses, spelled for other processes (a SQLite file or
    PostgreSQL)."""
    conf = connections["default"].settings_dict
    if conf["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{conf['NAME']}"
    user = conf.get("USER") or "postgres"
    password = f":{conf['PASSWORD']}" if conf.get("PASSWORD") else ""
    host, port = conf.get("HOST") or "127.0.0.1", conf.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{conf['NAME']}"


def _database_settings(url: str) -> dict:
    """Django's settings for `url`, as web.settings.base.database_settings makes them for a
    PostgreSQL URL (connections kept 60 s, health-checked before reuse)."""
    return dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)


@contextlib.contextmanager
def default_database(url: str):
    """Point this process's `default` connection at `url` (migrated first) for the block."""
    original = connections["default"]
    conf = connections.configure_settings({"default": _database_settings(url)})
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


def _reset_broker_pool(app) -> None:
    """Make the app open its broker connections and its result backend anew, at the URLs now
    configured (kombu keeps its pools by connection, so the previous URL's stay usable for
    whoever returns to it). Celery caches the backend per app, or per thread when it is not
    thread-safe: this thread's is reset, the one that sends the tasks."""
    app._pool = None
    app.amqp._producer_pool = None
    app._backend_cache = None
    app._local.__dict__.pop("backend", None)


@contextlib.contextmanager
def django_pointed_at(services: Services, use_database: bool = True):
    """This process's Django and Celery app on the fleet's Redis (and, with `use_database`, its
    database) for the block: the jobs it creates are sent to the fleet's controllers, the pages
    it times read the fleet's data."""
    caches = {
        name: {**conf, "LOCATION": services.redis_url}
        if "redis" in conf.get("BACKEND", "").lower()
        else conf
        for name, conf in settings.CACHES.items()
    }
    overrides = {
        "REDIS_URL": services.redis_url,
        "CELERY_BROKER_URL": services.redis_url,
        "CELERY_RESULT_BACKEND": services.redis_url,
        "CACHES": caches,
        "CONTROLLER_DISPATCH": True,
        "METRICS_TOKEN": METRICS_TOKEN,
        # The pages are timed through Django's test Client, whose requests name this host.
        "ALLOWED_HOSTS": [*settings.ALLOWED_HOSTS, "testserver"],
    }
    app = current_app
    before = (app.conf.broker_url, app.conf.result_backend)
    with override_settings(**overrides):
        app.conf.broker_url = services.redis_url
        app.conf.result_backend = services.redis_url
        _reset_broker_pool(app)
        try:
            if use_database:
                with default_database(services.database_url):
                    yield
            else:
                yield
        finally:
            app.conf.broker_url, app.conf.result_backend = before
            _reset_broker_pool(app)


def empty_database() -> None:
    """Every table of the current database emptied (the schema stays): between the sizes of a
    curve, on the run's own database only."""
    call_command("flush", verbosity=0, interactive=False)


def worker_env(services: Services, var_dir: Path) -> dict[str, str]:
    """The environment of the controller and beat processes: this process's settings module,
    the fleet's database and Redis."""
    return {
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "web.settings.local"),
        "DATABASE_URL": services.database_url,
        "REDIS_URL": services.redis_url,
        "TEST_REDIS_URL": services.redis_url,  # web.settings.test reads this one
        "CELERY_BROKER_URL": services.redis_url,
        "CELERY_RESULT_BACKEND": services.redis_url,
        "CONTROLLER_DISPATCH": "true",
        "BACKSTOP_VAR_DIR": str(var_dir),
    }
