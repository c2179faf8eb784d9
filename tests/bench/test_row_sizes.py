"""`manage.py row_sizes` (bench/row_sizes.py) at a tiny size: on PostgreSQL each table grew by
the rows inserted and every size is positive, the purge deleted what it was given, and neither
the run's database nor its stream is left behind; elsewhere it refuses, naming why."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from console.models import Job
from spark_runtime import keys as data_keys

pytestmark = pytest.mark.django_db

ROWS, PURGE_ROWS, STREAM_ENTRIES = 200, 1000, 100
# Of ROWS metric samples, a quarter as many decisions, a tenth as many faults and episodes.
INSERTED = {
    "metric sample": ROWS,
    "controller decision": ROWS // 4,
    "fault": ROWS // 10,
    "recovery episode": ROWS // 10,
}


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_each_table_grows_by_its_rows_in_a_database_of_the_runs_own(tmp_path, redis_conn):
    call_command(
        "row_sizes", "--rows", str(ROWS), "--purge-rows", str(PURGE_ROWS),
        "--stream-entries", str(STREAM_ENTRIES), "--out", str(tmp_path),
    )  # fmt: skip
    report = json.loads((tmp_path / "row-sizes.json").read_text())
    assert {label: t["inserted"] for label, t in report["tables"].items()} == INSERTED
    for label, table in report["tables"].items():
        assert table["rows_after"] - table["rows_before"] == INSERTED[label], label
        assert table["bytes_after"] > table["bytes_before"], label
        assert table["bytes_per_row"] > 0 and table["row_bytes"] > 0, label
    assert report["purge"]["deleted"] == PURGE_ROWS and report["purge"]["rows_per_s"] > 0
    stream = report["progress_record"]
    assert stream["entries"] == STREAM_ENTRIES and stream["bytes_per_entry"] > 0
    # Nothing left: the run's database dropped, its stream deleted, the test's database as it was.
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", ["%_bench_%"])
        assert cursor.fetchall() == []
    assert list(redis_conn.scan_iter(match=data_keys.progress("row-sizes-*"))) == []
    assert not Job.objects.filter(name="row-sizes").exists()


@pytest.mark.skipif("connection.vendor == 'postgresql'")
def test_elsewhere_than_postgresql_it_refuses_naming_why(tmp_path):
    with pytest.raises(CommandError, match="row_sizes needs PostgreSQL: .*pg_total_relation_size"):
        call_command("row_sizes", "--out", str(tmp_path))
    assert not (tmp_path / "row-sizes.json").exists()


def test_too_few_rows_are_refused_naming_the_option(tmp_path):
    with pytest.raises(CommandError, match="--purge-rows: at least 10"):
        call_command("row_sizes", "--purge-rows", "5", "--out", str(tmp_path))
