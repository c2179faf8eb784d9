"""`manage.py policy_explain` end to end through Django's call_command.

Runs only where Django settings are configured (pytest-django with web.settings.test); it needs
the database only because the command may read the Policy in force, and --defaults avoids even
that, but the marker keeps it safe if the lead's Policy.current() is used.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

django = pytest.importorskip("django")
from django.conf import settings  # noqa: E402

if not settings.configured:
    pytest.skip("Django settings are not configured", allow_module_level=True)

from django.core.management import call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
NODES = str(EXAMPLES / "nodes.json")
OPERATORS = str(EXAMPLES / "operators.json")


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("policy_explain", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_json_report_with_defaults():
    report = json.loads(
        run("--topology", "wordcount", "--nodes", NODES, "--operators", OPERATORS,
            "--defaults", "--json")
    )  # fmt: skip
    assert report["policy"] == "defaults (--defaults)"
    ops = {o["name"]: o for o in report["operators"]}
    assert list(ops) == ["source", "split", "count", "sink"]
    assert ops["count"]["cpu"] == 0.8  # from operators.json
    assert ops["count"]["mode"] == "active"
    assert ops["count"]["standby"] not in (None, ops["count"]["primary"])
    assert [n["name"] for n in report["nodes"]] == ["node-a", "node-b", "node-c"]


@pytest.mark.django_db
def test_table_output():
    text = run("--topology", "topn", "--nodes", NODES, "--defaults")
    assert "operator" in text and "window_count" in text and "node-a" in text


@pytest.mark.django_db
def test_policy_in_force_is_used_without_defaults():
    report = json.loads(run("--topology", "wordcount", "--nodes", NODES, "--json"))
    assert report["policy"]


@pytest.mark.django_db
def test_bad_files_raise_command_errors_naming_file_and_field(tmp_path):
    bad = tmp_path / "nodes.json"
    bad.write_text(json.dumps([{"name": "x", "cpu_total": "four"}]))
    with pytest.raises(CommandError, match=r"nodes\.json: node 0 \('x'\) is missing"):
        run("--topology", "wordcount", "--nodes", str(bad), "--defaults")
    broken = tmp_path / "ops.json"
    broken.write_text("{not json")
    with pytest.raises(CommandError, match=r"operators file .*ops\.json: not valid JSON"):
        run("--topology", "wordcount", "--nodes", NODES, "--operators", str(broken), "--defaults")
    with pytest.raises(CommandError, match="cannot read"):
        run("--topology", "wordcount", "--nodes", str(tmp_path / "missing.json"), "--defaults")
    with pytest.raises(CommandError, match="unknown topology"):
        run("--topology", "nope", "--nodes", NODES, "--defaults")
