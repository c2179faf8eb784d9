"""Behind a reverse proxy: X-Forwarded-For is believed only when the direct peer is trusted.

Login throttling and the audit log count the real client address: with the proxy trusted, five
failures from one client behind it lock out that client and not the others behind the same
proxy; without it (or with a client forging the header directly), the header changes nothing.
"""

import logging

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from console.middleware import client_address, parse_networks

pytestmark = pytest.mark.django_db

PROXY = "10.0.0.5"
GOOD = "pw-for-tests"


@pytest.mark.parametrize(
    "peer, forwarded, expected",
    [
        # No trusted peer: the header is ignored, whatever it says.
        ("198.51.100.7", "203.0.113.9", "198.51.100.7"),
        # One trusted proxy: the address it appended is the client.
        (PROXY, "203.0.113.9", "203.0.113.9"),
        # A client forging a chain through the proxy: only the rightmost untrusted hop counts.
        (PROXY, "1.2.3.4, 203.0.113.9", "203.0.113.9"),
        # Two trusted proxies (a CIDR block): walk past both.
        (PROXY, "203.0.113.9, 172.16.3.4", "203.0.113.9"),
        # Every hop trusted: the leftmost.
        (PROXY, "172.16.0.1", "172.16.0.1"),
        # Garbage reported through the proxy: not believed, the peer stays.
        (PROXY, "not-an-ip", PROXY),
        (PROXY, "", PROXY),
        ("2001:db8::1", "203.0.113.9", "2001:db8::1"),
    ],
)
def test_client_address_is_the_rightmost_untrusted_hop(peer, forwarded, expected):
    trusted = parse_networks((PROXY, "172.16.0.0/12"))
    assert client_address(peer, forwarded, trusted) == expected


def token(username, password, peer, forwarded=None):
    extra = {"REMOTE_ADDR": peer}
    if forwarded:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return APIClient().post(
        "/api/auth/token/", {"username": username, "password": password}, **extra
    )


def lock_out_address(peer, forwarded=None):
    """LOGIN_FAILURE_LIMIT failures, each for a different (unknown) username, from one address."""
    for attempt in range(settings.LOGIN_FAILURE_LIMIT):
        assert token(f"nobody{attempt}", "wrong", peer, forwarded).status_code == 400


def test_behind_a_trusted_proxy_the_real_client_is_locked_out(users, settings):
    settings.TRUSTED_PROXIES = [PROXY]
    lock_out_address(PROXY, "203.0.113.9")
    # The locked-out client behind the proxy is refused, even with the right password...
    assert token("vera", GOOD, PROXY, "203.0.113.9").status_code == 429
    # ...but another client behind the same proxy still logs in.
    assert token("vera", GOOD, PROXY, "203.0.113.10").status_code == 200


def test_without_trusted_proxies_the_header_is_ignored(users, settings):
    settings.TRUSTED_PROXIES = []
    lock_out_address("198.51.100.7", "203.0.113.9")
    # The peer is what counts: a forged header does not escape the lockout...
    assert token("vera", GOOD, "198.51.100.7", "203.0.113.77").status_code == 429
    # ...and does not lock out the address it names.
    assert token("vera", GOOD, "203.0.113.9").status_code == 200


def test_a_client_bypassing_the_proxy_cannot_forge_its_address(users, settings):
    settings.TRUSTED_PROXIES = [PROXY]
    lock_out_address("198.51.100.7", "203.0.113.9")
    assert token("vera", GOOD, "198.51.100.7", "203.0.113.10").status_code == 429


def test_audit_log_names_the_real_client(users, settings, caplog):
    settings.TRUSTED_PROXIES = [PROXY]
    with caplog.at_level(logging.INFO, logger="backstop.audit"):
        token("vera", "wrong", PROXY, "203.0.113.9")
        token("vera", GOOD, PROXY, "203.0.113.9")
        client = APIClient()
        client.post(
            "/accounts/login/",
            {"username": "otto", "password": GOOD},
            REMOTE_ADDR=PROXY,
            HTTP_X_FORWARDED_FOR="198.51.100.20",
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "backstop.audit"]
    assert "login-failed username='vera' address=203.0.113.9" in lines
    assert "token username='vera' address=203.0.113.9" in lines
    assert "login username='otto' address=198.51.100.20" in lines


def test_a_bad_trusted_proxies_value_stops_start_up(monkeypatch):
    from spark_runtime.env import ImproperlyConfiguredEnv, env
    from web.settings.base import _networks

    monkeypatch.setenv("TRUSTED_PROXIES", "10.0.0.5, 10.0.0.300/8")
    with pytest.raises(ImproperlyConfiguredEnv, match="TRUSTED_PROXIES"):
        env("TRUSTED_PROXIES", [], _networks)
    monkeypatch.setenv("TRUSTED_PROXIES", "10.0.0.5, 172.16.0.0/12, ::1")
    assert env("TRUSTED_PROXIES", [], _networks) == ["10.0.0.5", "172.16.0.0/12", "::1"]
