"""Fuzz the REST API against its own OpenAPI schema with schemathesis, as every role.

Every operation of /api/schema/ gets generated requests, valid ones (positive) and ones that break
the schema (negative), sent through Django's WSGI application as an anonymous client and with the
token of a viewer, an operator and an admin. Each response must:

- not be a server error (no 5xx);
- have a status code, content type and body the schema documents;
- respect the roles: an anonymous client gets nothing but a token, a viewer writes nothing, an
  operator never changes the policy (no 2xx where the role is too low).

The default suite runs a bounded, derandomized number of examples per operation and role; the
`slow` run draws many more, at random.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from console.models import Job, Policy
from console.roles import ADMIN, OPERATOR, VIEWER, has_role
from console.services.policy import change_policy
from tests.factories import EpisodeFactory, FaultFactory, NodeFactory, make_job
from web.wsgi import application

pytestmark = pytest.mark.django_db

ROLES = [None, VIEWER, OPERATOR, ADMIN]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


def required_role(method: str, path: str) -> str | None:
    """The lowest role a request needs to succeed (None: anyone)."""
    if path == "/api/auth/token/":
        return None
    if method.upper() in SAFE_METHODS:
        return VIEWER
    if path.startswith("/api/policy/"):
        return ADMIN
    return OPERATOR


@pytest.fixture(autouse=True)
def _keep_test_connection():
    """Requests go through the real WSGI handler, which closes the database connection when a
    request starts and ends; the test's transaction lives on that connection, so keep it open (as
    Django's test Client does)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def seed(users) -> None:
    """Something to find behind every path: a running job with faults, episodes, nodes, policy."""
    node = NodeFactory(name="node-1")
    NodeFactory(name="node-2")
    job = make_job(status=Job.Status.RUNNING)
    make_job(name="stopped", status=Job.Status.STOPPED)
    FaultFactory(job=job, target_node=node, requested_by=users[OPERATOR])
    EpisodeFactory(job=job)
    # The default version (written by no one: created_by null) and one written by an admin.
    Policy.current()
    change_policy({"priority_threshold": 0.5}, user=users[ADMIN], reason="fuzz seed")


def token_headers(users, role) -> dict[str, str]:
    if role is None:
        return {}
    token, _ = Token.objects.get_or_create(user=users[role])
    return {"Authorization": f"Token {token.key}"}


def fuzz(users, role, *, max_examples: int, derandomize: bool) -> None:
    """Drive every operation of the schema as `role`; fail on the first bad response."""
    seed(users)
    headers = token_headers(users, role)
    schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
    user = users[role] if role else None
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12, [op.label for op in operations]
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run_operation(operation, mode, headers, user, max_examples, derandomize)


def run_operation(operation, mode, headers, user, max_examples, derandomize) -> None:
    """Hypothesis-driven requests for one operation and generation mode."""

    @settings(
        max_examples=max_examples,
        derandomize=derandomize,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case):
        response = case.call(headers=headers)
        case.validate_response(response, checks=CHECKS)
        needed = required_role(case.method, operation.path)
        if 200 <= response.status_code < 300 and needed is not None:
            assert user is not None and has_role(user, needed), (
                f"{case.method} {case.formatted_path} answered {response.status_code} "
                f"to a user whose role is below {needed}"
            )

    try:
        check()
    except Unsatisfiable:
        # An operation with nothing to break (no parameters, no body) has no negative cases.
        if mode is not GenerationMode.NEGATIVE:
            raise


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role or "anonymous")
def test_api_conforms_to_its_schema_for_every_role(users, role):
    fuzz(users, role, max_examples=15, derandomize=True)


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES, ids=lambda role: role or "anonymous")
def test_api_conforms_to_its_schema_long_run(users, role):
    fuzz(users, role, max_examples=200, derandomize=False)
