"""The Dash endpoints as an attacker would call them: raw HTTP through Django's test client with
CSRF checks on (as a browser gets them), no buttons involved.

- no session, or a session without a role: 403 on every callback endpoint;
- no CSRF token, a wrong one, or a foreign Origin: 403 before Dash runs anything;
- a body that is not JSON (a cross-site form or text/plain POST): refused;
- a viewer forging the fault, stop, start and threshold callbacks: 403 and nothing changes, while
  an operator (an admin for thresholds) with the same request gets the action done;
- every response carries the security headers, and the CSP allows each inline script the
  console pages contain (and nothing else inline).
"""

import base64
import hashlib
import json
import re

import pytest
from django.conf import settings
from django.test import Client

from console.models import FaultInjection, Job, Policy
from console.roles import ADMIN, OPERATOR, VIEWER
from tests.dash.seed import seed_console

pytestmark = pytest.mark.django_db

UPDATE = "/django_plotly_dash/app/backstop-{app}/_dash-update-component"
PAGES = ["/console/", "/console/placement/", "/console/recoveries/", "/console/resources/"]


@pytest.fixture
def seeded():
    return seed_console(minutes=2)


def browser_client(user=None) -> tuple[Client, str]:
    """A client with CSRF checks on, logged in as `user`, holding the token a console page set."""
    client = Client(enforce_csrf_checks=True)
    if user is None:
        return client, ""
    client.force_login(user)
    assert client.get("/console/").status_code == 200
    return client, client.cookies[settings.CSRF_COOKIE_NAME].value


def post_update(client, app: str, body: dict, token: str | None, **extra):
    headers = {"HTTP_X_CSRFTOKEN": token} if token else {}
    return client.post(
        UPDATE.format(app=app),
        json.dumps(body),
        content_type=extra.pop("content_type", "application/json"),
        **headers,
        **extra,
    )


def fault_body(job) -> dict:
    return {
        "output": "fault-result.children",
        "outputs": {"id": "fault-result", "property": "children"},
        "inputs": [{"id": "fault-confirm", "property": "submit_n_clicks", "value": 1}],
        "state": [
            {"id": "fault-kind", "property": "value", "value": "kill-driver"},
            {"id": "fault-operator", "property": "value", "value": "split"},
            {"id": "fault-node", "property": "value", "value": None},
            {"id": "fault-duration", "property": "value", "value": None},
            {"id": "url", "property": "pathname", "value": f"/console/jobs/{job.pk}/"},
            {"id": "fault-workers", "property": "value", "value": None},
        ],
        "changedPropIds": ["fault-confirm.submit_n_clicks"],
    }


def job_stop_body(job) -> dict:
    return {
        "output": "stop-result.children",
        "outputs": {"id": "stop-result", "property": "children"},
        "inputs": [{"id": "stop-confirm", "property": "submit_n_clicks", "value": 1}],
        "state": [{"id": "url", "property": "pathname", "value": f"/console/jobs/{job.pk}/"}],
        "changedPropIds": ["stop-confirm.submit_n_clicks"],
    }


def overview_stop_body(job) -> dict:
    return {
        "output": "stop-result.children",
        "outputs": {"id": "stop-result", "property": "children"},
        "inputs": [{"id": "stop-confirm", "property": "submit_n_clicks", "value": 1}],
        "state": [{"id": "stop-job", "property": "value", "value": job.pk}],
        "changedPropIds": ["stop-confirm.submit_n_clicks"],
    }


def start_body() -> dict:
    return {
        "output": "start-result.children",
        "outputs": {"id": "start-result", "property": "children"},
        "inputs": [{"id": "start-button", "property": "n_clicks", "value": 1}],
        "state": [
            {"id": "start-name", "property": "value", "value": "forged"},
            {"id": "start-topology", "property": "value", "value": "wordcount"},
            {"id": "start-strategy", "property": "value", "value": "adaptive"},
            {"id": "start-rate", "property": "value", "value": 10},
            {"id": "start-source-topic", "property": "value", "value": ""},
            {"id": "start-sink-topic", "property": "value", "value": ""},
        ],
        "changedPropIds": ["start-button.n_clicks"],
    }


def threshold_body() -> dict:
    return {
        "output": "threshold-result.children",
        "outputs": {"id": "threshold-result", "property": "children"},
        "inputs": [{"id": "threshold-confirm", "property": "submit_n_clicks", "value": 1}],
        "state": [
            {"id": "threshold-field", "property": "value", "value": "resource_reserve"},
            {"id": "threshold-value", "property": "value", "value": 0.3},
            {"id": "threshold-reason", "property": "value", "value": "forged"},
        ],
        "changedPropIds": ["threshold-confirm.submit_n_clicks"],
    }


def controls_body() -> dict:
    """A read callback: the overview asks which controls to show (none for a viewer)."""
    return {
        "output": "controls.children",
        "outputs": {"id": "controls", "property": "children"},
        "inputs": [{"id": "url", "property": "pathname", "value": "/console/"}],
        "changedPropIds": ["url.pathname"],
    }


# --- session and CSRF -----------------------------------------------------------------------


@pytest.mark.parametrize("route", ["_dash-update-component", "_dash-layout", "_dash-dependencies"])
def test_without_a_session_every_dash_endpoint_answers_403(seeded, route):
    client = Client(enforce_csrf_checks=True)
    url = f"/django_plotly_dash/app/backstop-job/{route}"
    response = client.post(url, "{}", content_type="application/json")
    assert response.status_code == 403
    assert client.get(url).status_code == 403


def test_without_a_session_the_dash_page_redirects_to_the_login(seeded):
    response = Client().get("/django_plotly_dash/app/backstop-overview/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_a_user_without_a_role_gets_403(seeded, users):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users[None])
    assert client.get("/django_plotly_dash/app/backstop-overview/_dash-layout").status_code == 403


def test_a_callback_without_a_csrf_token_is_refused(seeded, users):
    client, _ = browser_client(users[OPERATOR])
    response = post_update(client, "job", fault_body(seeded.adaptive), token=None)
    assert response.status_code == 403
    assert b"CSRF" in response.content
    assert not FaultInjection.objects.filter(target_operator="split").exists()


def test_a_callback_with_a_wrong_csrf_token_is_refused(seeded, users):
    client, _ = browser_client(users[OPERATOR])
    response = post_update(client, "job", fault_body(seeded.adaptive), token="x" * 32)
    assert response.status_code == 403
    assert not FaultInjection.objects.filter(target_operator="split").exists()


def test_a_callback_from_a_foreign_origin_is_refused(seeded, users):
    client, token = browser_client(users[OPERATOR])
    response = post_update(
        client, "job", fault_body(seeded.adaptive), token, HTTP_ORIGIN="https://evil.example"
    )
    assert response.status_code == 403
    assert not FaultInjection.objects.filter(target_operator="split").exists()


def test_a_text_plain_callback_is_refused(seeded, users):
    client, token = browser_client(users[OPERATOR])
    response = post_update(
        client, "job", fault_body(seeded.adaptive), token, content_type="text/plain"
    )
    assert response.status_code == 415
    assert not FaultInjection.objects.filter(target_operator="split").exists()


def test_read_callbacks_work_with_session_and_token(seeded, users):
    client, token = browser_client(users[VIEWER])
    response = post_update(client, "overview", controls_body(), token)
    assert response.status_code == 200
    assert response.json()["response"] == {"controls": {"children": None}}


# --- each control checks the role again ------------------------------------------------------


def test_a_viewer_forging_a_fault_gets_403_and_an_operator_injects_it(seeded, users):
    client, token = browser_client(users[VIEWER])
    assert post_update(client, "job", fault_body(seeded.adaptive), token).status_code == 403
    assert not FaultInjection.objects.filter(target_operator="split").exists()

    client, token = browser_client(users[OPERATOR])
    response = post_update(client, "job", fault_body(seeded.adaptive), token)
    assert response.status_code == 200
    assert FaultInjection.objects.get(target_operator="split").requested_by == users[OPERATOR]


@pytest.mark.parametrize("app, body", [("job", job_stop_body), ("overview", overview_stop_body)])
def test_a_viewer_forging_a_stop_gets_403_and_an_operator_stops(seeded, users, app, body):
    job = seeded.baseline
    client, token = browser_client(users[VIEWER])
    assert post_update(client, app, body(job), token).status_code == 403
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING

    client, token = browser_client(users[OPERATOR])
    assert post_update(client, app, body(job), token).status_code == 200
    job.refresh_from_db()
    assert job.status in (Job.Status.STOPPING, Job.Status.STOPPED)


def test_a_viewer_forging_a_start_gets_403_and_an_operator_starts(seeded, users):
    client, token = browser_client(users[VIEWER])
    assert post_update(client, "overview", start_body(), token).status_code == 403
    assert not Job.objects.filter(name="forged").exists()

    client, token = browser_client(users[OPERATOR])
    assert post_update(client, "overview", start_body(), token).status_code == 200
    assert Job.objects.get(name="forged").created_by == users[OPERATOR]


@pytest.mark.parametrize("role", [VIEWER, OPERATOR])
def test_below_admin_forging_a_threshold_gets_403(seeded, users, role):
    version = Policy.current().version
    client, token = browser_client(users[role])
    assert post_update(client, "placement", threshold_body(), token).status_code == 403
    assert Policy.current().version == version


def test_an_admin_changes_a_threshold_through_the_callback(seeded, users):
    version = Policy.current().version
    client, token = browser_client(users[ADMIN])
    assert post_update(client, "placement", threshold_body(), token).status_code == 200
    policy = Policy.current()
    assert (policy.version, policy.resource_reserve) == (version + 1, 0.3)


# --- security headers -----------------------------------------------------------------------


def _csp_hashes(policy: str) -> set[str]:
    script_src = next(d for d in policy.split(";") if d.strip().startswith("script-src"))
    return {token.strip("'") for token in script_src.split() if token.startswith("'sha256-")}


def test_security_headers_on_pages_dash_and_api(seeded, users):
    client, _ = browser_client(users[VIEWER])
    for url in ["/console/", "/django_plotly_dash/app/backstop-overview/_dash-layout", "/api/"]:
        response = client.get(url)
        assert response["X-Content-Type-Options"] == "nosniff"
        assert response["Referrer-Policy"] == "same-origin"
        assert response["X-Frame-Options"] == "DENY"
        policy = response["Content-Security-Policy"]
        assert "default-src 'self'" in policy
        assert "frame-ancestors 'none'" in policy
        assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]


def test_every_inline_script_of_the_console_is_allowed_by_the_csp(seeded, users):
    client, _ = browser_client(users[VIEWER])
    urls = [*PAGES, f"/console/jobs/{seeded.adaptive.pk}/", "/", "/api/docs/", "/admin/login/"]
    client.force_login(users[ADMIN])
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        allowed = _csp_hashes(response["Content-Security-Policy"])
        for attrs, body in re.findall(
            r"<script([^>]*)>(.*?)</script>", response.content.decode(), re.S
        ):
            if "src=" in attrs or "application/json" in attrs:
                continue  # files from this site, or data that is never run
            digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            assert f"sha256-{digest}" in allowed, f"{url}: inline script {body[:60]!r}"


def test_every_console_dash_app_is_registered_by_migrate():
    """Registered up front, so concurrent first requests do not race to create the rows."""
    from django_plotly_dash.models import StatelessApp

    names = set(StatelessApp.objects.values_list("app_name", flat=True))
    assert {
        "backstop-overview",
        "backstop-job",
        "backstop-placement",
        "backstop-recoveries",
        "backstop-resources",
    } <= names


@pytest.mark.parametrize(
    "body, message",
    [
        ([1, 2, 3], "request body: expected a JSON object"),
        ({"output": 1}, "output: must be a string"),
        ({"output": "nope.children", "inputs": []}, "output: no callback of this page writes"),
        (
            {"output": "controls.children", "outputs": {"id": "controls"}, "inputs": []},
            "outputs: each entry needs an id and a property",
        ),
        (
            {"output": "controls.children", "outputs": {"id": "controls", "property": "children"},
             "inputs": "x"},
            "inputs: must be a list",
        ),
        (
            {"output": "controls.children", "outputs": {"id": "controls", "property": "children"},
             "inputs": [1, 2]},
            "inputs: each entry must be an object",
        ),
        (
            {"output": "controls.children", "outputs": {"id": "controls", "property": "children"},
             "inputs": [{"id": "url", "property": "pathname", "value": "/"}],
             "changedPropIds": [3]},
            "changedPropIds: must be a list of strings",
        ),
    ],
)  # fmt: skip
def test_a_callback_request_of_the_wrong_shape_is_a_json_400_naming_what_is_wrong(
    seeded, users, body, message
):
    client, token = browser_client(users[VIEWER])
    response = post_update(client, "job", body, token)
    assert response.status_code == 400
    assert response.json()["error"]["detail"].startswith(message)
