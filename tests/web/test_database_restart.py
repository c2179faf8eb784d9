"""The console's database connections after a PostgreSQL restart, on a server of the test's own
(tests/postgres_server.py): the first request after the restart reconnects instead of failing."""

from __future__ import annotations

import pytest
from django.db import close_old_connections, connection

from console.models import Node
from tests.postgres_server import default_database

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_first_request_after_a_database_crash_reconnects(private_postgres):
    with default_database(private_postgres.url):
        Node.objects.create(name="node-a", cpu_total=2.0, mem_total_mb=4000.0)
        kept = connection.connection  # kept between requests: CONN_MAX_AGE is 60 s

        private_postgres.crash()
        private_postgres.start()

        # Django's request_started handler, as before every request the web server handles.
        close_old_connections()
        assert list(Node.objects.values_list("name", flat=True)) == ["node-a"]
        assert connection.connection is not kept, "the ended session was replaced"
