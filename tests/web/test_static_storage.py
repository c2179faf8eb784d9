"""Pages render with the default settings' static storage from a fresh clone, before anything ran
`collectstatic`, and link the hashed names once it has."""

import importlib
import json

import pytest

from web.settings import local
from web.staticfiles import ManifestOnceCollected

pytestmark = pytest.mark.django_db

HASHED = "backstop.0123456789ab.css"


@pytest.fixture
def default_storage(settings, tmp_path):
    """The default settings' (web.settings.local) static storage over an empty STATIC_ROOT."""
    settings.STORAGES = local.STORAGES
    settings.STATIC_ROOT = tmp_path
    settings.DEBUG = False  # with DEBUG on, Django links the plain names whatever the storage
    return tmp_path


def write_manifest(static_root, paths: dict[str, str]) -> None:
    """A manifest as `collectstatic` writes it (Django's format 1.1)."""
    payload = {"paths": paths, "version": "1.1", "hash": "0123456789ab"}
    (static_root / "staticfiles.json").write_text(json.dumps(payload))


def test_a_page_renders_before_anything_was_collected(client, default_storage):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert 'href="/static/backstop.css"' in response.content.decode()


def test_a_page_links_the_hashed_names_once_collected(client, default_storage):
    write_manifest(default_storage, {"backstop.css": HASHED})
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert f'href="/static/{HASHED}"' in response.content.decode()


def test_a_file_missing_from_a_collected_manifest_is_an_error(settings, tmp_path):
    settings.DEBUG = False
    write_manifest(tmp_path, {"backstop.css": HASHED})
    with pytest.raises(ValueError, match="Missing staticfiles manifest entry for 'other.css'"):
        ManifestOnceCollected(location=tmp_path).url("other.css")


def test_production_never_links_plain_names(monkeypatch):
    # The image collects when it is built (docker/Dockerfile): nothing collected there is a fault.
    monkeypatch.setenv("SECRET_KEY", "for-this-test")
    production = importlib.import_module("web.settings.production")
    backend = production.STORAGES["staticfiles"]["BACKEND"]
    assert backend == "whitenoise.storage.CompressedManifestStaticFilesStorage"
