"""Fixtures of the live tests of existing apps (tests/integration/test_app_*.py), which ask
for them with `pytest.mark.usefixtures("jobs_dir", "people")`: set up before the cluster
starts, which reads the jobs directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from console.roles import ADMIN, OPERATOR
from tests.factories import UserFactory

APPS = Path(__file__).resolve().parents[2] / "jobs" / "apps"


@pytest.fixture
def jobs_dir(tmp_path, monkeypatch):
    """A jobs directory with the example apps, set before the cluster starts."""
    directory = tmp_path / "jobs"
    shutil.copytree(APPS, directory / "apps")
    monkeypatch.setenv("BACKSTOP_JOBS_DIR", str(directory))
    return directory


@pytest.fixture
def people(transactional_db):
    """The operator "opal" that `live.api()` logs in as; the admin is returned."""
    UserFactory(username="opal", role=OPERATOR)
    return UserFactory(username="adam", role=ADMIN)
