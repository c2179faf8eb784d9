"""`manage.py row_sizes`: bytes per stored record and the purge's speed, for docs/RELIABILITY.md
("Retention"), in a database of the run's own on the configured PostgreSQL (bench/row_sizes.py
says how nothing of a user's is touched).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/backstop manage.py row_sizes
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from bench.alert_latency import when_text
from bench.results import command_line, write_report
from bench.row_sizes import RowSizeSettings, render, run
from bench.scratch import ScratchDatabaseError, scratch_database
from console.redis import redis_client


class Command(BaseCommand):
    help = (
        "Insert --rows rows of each table Backstop grows into a database of the run's own on "
        "the configured PostgreSQL, print each table's growth per row and its average row, "
        "time the purge of --purge-rows old samples and the Redis memory of --stream-entries "
        "progress records, write DIR/row-sizes.json; the database and stream are removed at "
        "the end. Needs PostgreSQL."
    )

    def add_arguments(self, parser):
        parser.add_argument("--rows", type=int, default=RowSizeSettings.rows)
        parser.add_argument("--purge-rows", type=int, default=RowSizeSettings.purge_rows)
        parser.add_argument("--stream-entries", type=int, default=RowSizeSettings.stream_entries)
        parser.add_argument("--out", default="var/row-sizes", help="where the JSON goes")

    def handle(self, *args, **options):
        try:
            settings = RowSizeSettings(
                rows=options["rows"],
                purge_rows=options["purge_rows"],
                stream_entries=options["stream_entries"],
            )
        except ValueError as exc:
            raise CommandError("--" + str(exc).replace("_", "-", 1)) from None
        if connection.vendor != "postgresql":
            raise CommandError(
                "row_sizes needs PostgreSQL: it measures with pg_total_relation_size and "
                f"pg_column_size, which {connection.vendor} has no counterpart of; set "
                "DATABASE_URL to a PostgreSQL (the run makes a database of its own there)"
            )
        started = time.time()
        command = command_line(
            "row_sizes", options, ("rows", "purge_rows", "stream_entries", "out")
        )
        try:
            with scratch_database(self._say):
                report = run(settings, redis_client(), self._say)
        except ScratchDatabaseError as exc:
            raise CommandError(str(exc)) from None
        report["command"] = command
        path = write_report(options["out"], "row-sizes.json", report)
        self.stdout.write(render(report, command, when_text(started)))
        self._say(f"wrote {path}")

    def _say(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()
