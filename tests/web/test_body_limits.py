"""Oversized bodies get a JSON 413 and JSON nested too deep a JSON 400, on the API (jobs,
faults, token) and the Dash endpoints alike: never a 500."""

import json

import pytest
from django.conf import settings
from django.test import Client

from console.middleware import json_depth_exceeds
from console.roles import OPERATOR
from tests.factories import make_job

pytestmark = pytest.mark.django_db

DASH_UPDATE = "/django_plotly_dash/app/backstop-job/_dash-update-component"
DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture
def operator_client(users):
    client = Client()
    client.force_login(users[OPERATOR])
    return client


def _endpoints():
    job = make_job()
    return ["/api/jobs/", f"/api/jobs/{job.pk}/faults/", "/api/auth/token/", DASH_UPDATE]


def test_a_body_over_the_limit_is_a_json_413_everywhere(operator_client):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    body = json.dumps({"name": "x", "params": {"pad": "x" * limit}})
    for url in _endpoints():
        response = operator_client.post(url, body, content_type="application/json")
        assert response.status_code == 413, url
        assert response.json()["error"] == {
            "status": 413,
            "code": "payload_too_large",
            "detail": f"request body: at most {limit} bytes, got {len(body)}",
        }


def test_json_nested_5000_levels_is_a_json_400_everywhere(operator_client):
    for url in _endpoints():
        response = operator_client.post(url, DEEP, content_type="application/json")
        assert response.status_code == 400, url
        error = response.json()["error"]
        assert error["status"] == 400
        assert error["detail"] == "request body: JSON nested deeper than 64 levels"


def test_deep_nesting_inside_job_params_is_refused_too(operator_client):
    body = '{"name": "x", "topology": "wordcount", "params": ' + DEEP + "}"
    response = operator_client.post("/api/jobs/", body, content_type="application/json")
    assert response.status_code == 400


def test_ordinary_requests_pass(operator_client):
    response = operator_client.post(
        "/api/jobs/",
        {"name": "wc", "topology": "wordcount", "params": {"rate": 5}},
        content_type="application/json",
    )
    assert response.status_code == 201


def test_a_bad_content_length_is_a_json_400(operator_client):
    response = operator_client.generic(
        "POST", "/api/jobs/", b"{}", content_type="application/json", CONTENT_LENGTH="lots"
    )
    assert response.status_code == 400
    assert response.json()["error"]["detail"] == "Content-Length: not a number"


@pytest.mark.parametrize(
    "body, deep",
    [
        (b"[" * 65 + b"]" * 65, True),
        (b"[" * 64 + b"]" * 64, False),
        (b'{"a": "' + b"[" * 1000 + b'"}', False),  # brackets inside a string do not count
        (b'{"a": "\\"[[[[", "b": [[1]]}', False),  # nor after an escaped quote
        (b"]]]]" + b"[" * 10, False),
    ],
)
def test_depth_scanner(body, deep):
    assert json_depth_exceeds(body, 64) is deep


def test_malformed_json_to_a_dash_endpoint_is_a_json_400(operator_client):
    response = operator_client.post(DASH_UPDATE, '{"output": ', content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["detail"].startswith("request body: not valid JSON")


@pytest.mark.parametrize(
    "body, field",
    [([1], "non_field_errors"), ("abc", "non_field_errors"), ({"username": {"a": 1}}, "username")],
)
def test_the_token_endpoint_refuses_bodies_that_are_not_credentials(body, field):
    response = Client().post("/api/auth/token/", json.dumps(body), content_type="application/json")
    assert response.status_code == 400
    assert field in response.json()["error"]["detail"]
