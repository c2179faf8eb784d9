"""Settings come from the environment through one helper that fails loudly."""

import os
import subprocess
import sys

import pytest

from spark_runtime.env import ImproperlyConfiguredEnv, env, parse_bool, parse_list, parse_url
from web.settings.base import _email_settings


def test_env_returns_default_when_unset(monkeypatch):
    monkeypatch.delenv("BACKSTOP_X", raising=False)
    assert env("BACKSTOP_X", 7, int) == 7


def test_env_parses_values(monkeypatch):
    monkeypatch.setenv("BACKSTOP_X", "42")
    assert env("BACKSTOP_X", 7, int) == 42


def test_env_names_the_variable_on_a_bad_value(monkeypatch):
    monkeypatch.setenv("BACKSTOP_X", "ten")
    with pytest.raises(ImproperlyConfiguredEnv, match="BACKSTOP_X"):
        env("BACKSTOP_X", 7, int)


def test_required_variable_missing(monkeypatch):
    monkeypatch.delenv("BACKSTOP_X", raising=False)
    with pytest.raises(ImproperlyConfiguredEnv, match="BACKSTOP_X is required"):
        env("BACKSTOP_X")


@pytest.mark.parametrize("raw, value", [("1", True), ("yes", True), ("off", False), ("0", False)])
def test_parse_bool(raw, value):
    assert parse_bool(raw) is value


def test_parse_bool_rejects_junk():
    with pytest.raises(ValueError):
        parse_bool("maybe")


def test_parse_list_drops_blanks():
    assert parse_list(" a, b ,,c ") == ["a", "b", "c"]


def test_parse_url_checks_scheme():
    assert parse_url(("redis",))("redis://h:1/0") == "redis://h:1/0"
    with pytest.raises(ValueError, match="scheme redis"):
        parse_url(("redis",))("http://h")


def test_email_url_smtp():
    settings = _email_settings("smtp+tls://me%40x.org:s3cret@mail.example:2525")
    assert settings["EMAIL_HOST"] == "mail.example"
    assert settings["EMAIL_PORT"] == 2525
    assert settings["EMAIL_HOST_USER"] == "me@x.org"
    assert settings["EMAIL_HOST_PASSWORD"] == "s3cret"
    assert settings["EMAIL_USE_TLS"] is True


def _import_settings(module: str, **environ) -> subprocess.CompletedProcess:
    env_vars = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DATABASE_URL")}
    env_vars.update(environ)
    return subprocess.run(
        [sys.executable, "-c", f"import {module} as s; print(s.DATABASES['default']['ENGINE'])"],
        capture_output=True,
        text=True,
        env=env_vars,
        check=False,
    )


def test_production_requires_secret_key():
    result = _import_settings("web.settings.production")
    assert result.returncode != 0
    assert "SECRET_KEY is required" in result.stderr


def test_database_url_selects_postgresql():
    result = _import_settings(
        "web.settings.production", SECRET_KEY="x", DATABASE_URL="postgres://u@db:5432/b"
    )
    assert result.stdout.strip() == "django.db.backends.postgresql"


def test_bad_database_url_fails_loudly():
    result = _import_settings("web.settings.local", DATABASE_URL="mysql://x/y")
    assert "DATABASE_URL" in result.stderr


def test_a_spark_log_level_spark_does_not_know_is_refused_naming_the_variable(monkeypatch):
    from spark_runtime.config import spark_log_level

    monkeypatch.setenv("SPARK_LOG_LEVEL", "loud")
    with pytest.raises(ImproperlyConfiguredEnv, match="SPARK_LOG_LEVEL: one of ALL, TRACE"):
        env("SPARK_LOG_LEVEL", "WARN", spark_log_level)
    monkeypatch.setenv("SPARK_LOG_LEVEL", "info")
    assert env("SPARK_LOG_LEVEL", "WARN", spark_log_level) == "INFO"
