"""A database of a benchmark's own, beside the configured one, so a measurement that inserts rows
never touches a user's data and leaves nothing behind.

On PostgreSQL: a new database `<configured name>_bench_<pid>` on the configured server, as the
configured role (which must be allowed to create databases, as pytest-django's test database
needs too), migrated, and dropped at the end. On SQLite: a new file in a temporary directory,
migrated, deleted at the end. Only this process's `default` connection points at it in between
(bench.fleet.services.default_database), so nothing else (a running controller, the console)
sees its rows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg2
from django.db import connections

from bench.fleet.services import database_url_of_default, default_database


class ScratchDatabaseError(RuntimeError):
    """The benchmark's own database could not be made (the configured role may not create
    databases, or the server does not answer)."""


def _postgres_admin(url: str):
    parts = urlsplit(url)
    conn = psycopg2.connect(
        dbname=parts.path.lstrip("/"),
        user=parts.username,
        password=parts.password,
        host=parts.hostname,
        port=parts.port or 5432,
    )
    conn.autocommit = True  # CREATE and DROP DATABASE run outside a transaction
    return conn


@contextlib.contextmanager
def scratch_database(say=None) -> Iterator[str]:
    """This process's `default` database replaced, for the block, by a migrated empty one of
    its own on the configured server (see the module docstring); yields its URL."""
    configured = database_url_of_default()
    if connections["default"].vendor == "postgresql":
        name = f"{connections['default'].settings_dict['NAME']}_bench_{os.getpid()}"
        try:
            admin = _postgres_admin(configured)
            with admin.cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
                cursor.execute(f'CREATE DATABASE "{name}"')
        except psycopg2.Error as exc:
            raise ScratchDatabaseError(
                f"cannot create the benchmark's own database {name} on the configured "
                f"PostgreSQL ({str(exc).strip()}): its role needs CREATEDB"
            ) from exc
        url = urlunsplit(urlsplit(configured)._replace(path=f"/{name}"))
        try:
            if say is not None:
                say(f"database of its own: {name} on the configured server; migrating")
            with default_database(url):
                yield url
        finally:
            with admin.cursor() as cursor:
                cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
            admin.close()
            if say is not None:
                say(f"dropped {name}")
        return
    directory = tempfile.mkdtemp(prefix="backstop-bench-db-")
    url = f"sqlite:///{directory}/bench.sqlite3"
    try:
        if say is not None:
            say(f"database of its own: {directory}/bench.sqlite3; migrating")
        with default_database(url):
            yield url
    finally:
        shutil.rmtree(directory, ignore_errors=True)
