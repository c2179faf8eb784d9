"""Without DEBUG (the demo's default too), errors are short pages or JSON saying what went wrong,
never a traceback; `manage.py demo` says how to turn DEBUG on."""

import json
import os
import subprocess
import sys

import pytest
from django.test import Client, RequestFactory

from console import views
from console.management.commands.demo import debug_note
from console.roles import VIEWER

pytestmark = pytest.mark.django_db

DASH_UPDATE = "/django_plotly_dash/app/backstop-job/_dash-update-component"


def _local_debug(**environ) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DEBUG"}
    env.update(environ, DJANGO_SETTINGS_MODULE="web.settings.local")
    return subprocess.run(
        [sys.executable, "-c", "import web.settings.local as s; print(s.DEBUG)"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.strip()  # fmt: skip


def test_the_demo_settings_run_without_debug_unless_asked():
    assert _local_debug() == "False"
    assert _local_debug(DEBUG="1") == "True"


def test_the_demo_says_how_to_turn_debug_on():
    assert "DEBUG=1" in debug_note(False) and "DEBUG is off" in debug_note(False)
    assert "DEBUG is on" in debug_note(True)


@pytest.fixture
def viewer_client(users):
    client = Client(raise_request_exception=False)
    client.force_login(users[VIEWER])
    return client


def test_a_malformed_dash_request_gets_json_without_a_traceback(viewer_client):
    """Valid JSON that is not a Dash callback request: Dash fails inside; the answer is a JSON
    500 naming no internals (the traceback goes to the log only)."""
    response = viewer_client.post(DASH_UPDATE, json.dumps({"output": 1}), "application/json")
    assert response.status_code in (400, 500)
    body = response.content.decode()
    assert "Traceback" not in body and 'File "' not in body
    assert response.json()["error"]["status"] == response.status_code


def test_a_failing_page_shows_the_500_page(viewer_client, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(views, "render", broken)
    response = viewer_client.get("/")
    assert response.status_code == 500
    body = response.content.decode()
    assert "Server error (500)" in body
    assert "secret internals" not in body and "Traceback" not in body


def test_a_missing_page_shows_the_404_page(viewer_client):
    response = viewer_client.get("/console/jobs/999999/")
    assert response.status_code == 404
    assert "Not found (404)" in response.content.decode()
    assert "/console/jobs/999999/" in response.content.decode()


@pytest.mark.parametrize(
    "handler, status, words",
    [
        (views.bad_request, 400, "Bad request (400)"),
        (views.permission_denied, 403, "Not allowed (403)"),
        (views.api_not_found, 404, "Not found (404)"),
    ],
)
def test_each_error_page_exists_and_api_paths_get_json(handler, status, words):
    page = handler(RequestFactory().get("/console/x/"), exception=None)
    assert page.status_code == status and words in page.content.decode()
    api = handler(RequestFactory().get("/api/x/"), exception=None)
    assert api.status_code == status
    assert json.loads(api.content)["error"]["status"] == status
    assert views.server_error(RequestFactory().get("/console/")).status_code == 500
    assert b"Server error (500)" in views.server_error(RequestFactory().get("/")).content
