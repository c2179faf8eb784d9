"""The OpenAPI schema generates and documents every endpoint; the docs UI is served locally."""

import pytest

pytestmark = pytest.mark.django_db


def test_schema_lists_every_endpoint(client):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    paths = set(response.json()["paths"])
    expected = {
        "/api/auth/token/",
        "/api/jobs/",
        "/api/jobs/{id}/",
        "/api/jobs/{id}/stop/",
        "/api/jobs/{id}/results/",
        "/api/jobs/{job_pk}/faults/",
        "/api/jobs/{job_pk}/recoveries/",
        "/api/nodes/",
        "/api/policy/",
        "/api/policy/history/",
    }
    assert expected <= paths


def test_schema_generation_has_no_warnings(capsys):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_docs_ui_uses_local_assets(client):
    body = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in body
    assert "cdn.jsdelivr" not in body
