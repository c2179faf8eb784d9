"""`manage.py check --deploy` with the production settings reports nothing, and HTTPS is on.

The checks include the one of the Redis in use (console/checks.py), so the commands run against
a Redis configured as production needs it (append-only, noeviction), a server of the module's
own: the machine's Redis persists nothing and would be reported, rightly."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.configured_redis import ConfiguredRedis

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def production_redis(tmp_path_factory):
    server = ConfiguredRedis(
        tmp_path_factory.mktemp("redis"), args=["--maxmemory-policy", "noeviction"]
    )
    server.start()
    os.environ["BACKSTOP_DEPLOY_CHECK_REDIS"] = server.url
    try:
        yield server
    finally:
        del os.environ["BACKSTOP_DEPLOY_CHECK_REDIS"]
        server.stop()


def run_production(*args: str, **environ: str) -> subprocess.CompletedProcess:
    """Run manage.py with web.settings.production and a strong SECRET_KEY (plus `environ`)."""
    env_vars = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SECRET_KEY", "DJANGO_SETTINGS_MODULE", "DEBUG")
        and not k.startswith("SECURE_")
    }
    env_vars.update(
        DJANGO_SETTINGS_MODULE="web.settings.production",
        SECRET_KEY=secrets.token_urlsafe(64),
        REDIS_URL=os.environ["BACKSTOP_DEPLOY_CHECK_REDIS"],
        **environ,
    )
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env_vars,
        check=False,
        timeout=120,
    )


def test_check_deploy_reports_nothing():
    result = run_production("check", "--deploy", "--fail-level", "DEBUG")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_check_deploy_names_what_a_weak_setup_lacks():
    # Turning HTTPS off must show up: the check is what keeps the settings honest.
    result = run_production(
        "check", "--deploy", SECURE_SSL_REDIRECT="false", SECURE_HSTS_SECONDS="0"
    )
    assert "security.W004" in result.stderr + result.stdout
    assert "security.W008" in result.stderr + result.stdout


SHOW = (
    "from django.conf import settings as s; "
    "print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.X_FRAME_OPTIONS, "
    "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER)"
)


def test_production_settings_are_https_only():
    result = run_production("shell", "-c", SHOW)
    assert result.returncode == 0, result.stderr
    # The last line: Django's shell may first say how many objects it imported.
    shown = result.stdout.splitlines()[-1].split()
    assert shown == ["True", "31536000", "DENY", "True", "True", "None"]


def test_proxy_ssl_header_is_configurable():
    result = run_production(
        "shell", "-c", SHOW, SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].endswith("('HTTP_X_FORWARDED_PROTO', 'https')")


def test_a_malformed_proxy_ssl_header_stops_start_up_naming_it():
    result = run_production("check", SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto")
    assert result.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER" in result.stderr
