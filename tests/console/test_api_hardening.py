"""What the schema fuzzer found, pinned: bad input is a 400 naming the field; nulls documented."""

import pytest
from rest_framework.test import APIClient

from console.models import Policy
from console.roles import OPERATOR, VIEWER
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def test_token_with_a_list_as_username_is_a_400_naming_the_field():
    response = APIClient().post(
        "/api/auth/token/", {"username": [None, None], "password": ""}, format="json"
    )
    assert response.status_code == 400
    assert "username" in response.json()["error"]["detail"]


@pytest.mark.parametrize("body", ["true", "7", "[1, 2]", '"ada"', "null"])
def test_token_with_a_body_that_is_not_an_object_is_a_400(body):
    response = APIClient().post("/api/auth/token/", body, content_type="application/json")
    assert response.status_code == 400, response.content


@pytest.mark.parametrize("path", ["/api/jobs/", "/api/nodes/"])
@pytest.mark.parametrize(
    "query, field",
    [
        ("limit=23506822163744886784&offset=-304", "limit"),
        ("limit=10&offset=-304", "offset"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("offset=null", "offset"),
        ("offset=true", "offset"),
        ("limit=1.5", "limit"),
        ("offset=99999999999999999999", "offset"),
    ],
)
def test_bad_pagination_is_a_400_naming_the_parameter(api_as, path, query, field):
    response = api_as(VIEWER).get(f"{path}?{query}")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["detail"]


def test_pagination_within_bounds_pages(api_as):
    for name in ("a", "b", "c"):
        make_job(name=name)
    body = api_as(VIEWER).get("/api/jobs/?limit=2&offset=1").json()
    assert body["count"] == 3
    assert len(body["results"]) == 2


def test_schema_states_the_pagination_bounds_and_nullable_users(client):
    schema = client.get("/api/schema/?format=json").json()
    listed = schema["paths"]["/api/jobs/"]["get"]["parameters"]
    parameters = {p["name"]: p["schema"] for p in listed}
    assert parameters["limit"]["minimum"] == 1 and parameters["limit"]["maximum"] == 1000
    assert parameters["offset"]["minimum"] == 0
    components = schema["components"]["schemas"]
    assert components["Policy"]["properties"]["created_by"]["nullable"] is True
    assert components["Job"]["properties"]["created_by"]["nullable"] is True


def test_schema_documents_error_responses(client):
    paths = client.get("/api/schema/?format=json").json()["paths"]
    faults = paths["/api/jobs/{job_pk}/faults/"]["post"]["responses"]
    assert {"400", "401", "403", "404", "409", "413", "415", "429"} <= set(faults)
    assert faults["403"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"
    }
    assert {"400", "401", "403", "404"} <= set(paths["/api/nodes/"]["get"]["responses"])


def test_policy_without_author_answers_null(api_as):
    Policy.current()  # the default version, written by no one
    Policy.objects.update(created_by=None)
    assert api_as(VIEWER).get("/api/policy/").json()["created_by"] is None
    history = api_as(VIEWER).get("/api/policy/history/").json()
    assert history and all(version["created_by"] is None for version in history)


@pytest.mark.parametrize("name", ["count", "seed"])
def test_a_job_count_or_seed_past_64_bits_is_a_400_naming_params(api_as, name):
    response = api_as(OPERATOR).post(
        "/api/jobs/",
        {"name": "big", "topology": "wordcount", "params": {name: 2**64}},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert f"params.{name}" in " ".join(response.json()["error"]["detail"]["params"])
