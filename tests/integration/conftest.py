"""Fixtures of the live tests of existing apps (tests/integration/test_app_*.py), which ask
for them with `pytest.mark.usefixtures("jobs_dir", "people")`: set up before the cluster
starts, which reads the jobs directory."""

from __future__ import annotations

import pytest

from console.roles import ADMIN, OPERATOR
from tests.factories import UserFactory


@pytest.fixture
def people(transactional_db):
    """The operator "opal" that `live.api()` logs in as; the admin is returned."""
    UserFactory(username="opal", role=OPERATOR)
    return UserFactory(username="adam", role=ADMIN)
