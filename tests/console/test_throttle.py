"""Login throttling on the HTML login, the admin login and the API token endpoint."""

import time
import uuid

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from console import auth_throttle
from console.roles import ADMIN
from web.settings.base import cache_settings

pytestmark = pytest.mark.django_db

GOOD = "pw-for-tests"  # the factories' password


@pytest.fixture(autouse=True)
def shared_cache():
    """The real Redis cache of the test settings, with a key prefix of this test's own.

    A fresh prefix isolates each test's counters without flushing the database; the keys expire
    after LOGIN_FAILURE_WINDOW_S anyway.
    """
    caches = cache_settings(settings.REDIS_URL)
    caches["default"]["KEY_PREFIX"] = f"test-{uuid.uuid4().hex}"
    with override_settings(CACHES=caches):
        yield


def html_login(client, username, password, address="127.0.0.1"):
    return client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address
    )


def token(username, password, address="127.0.0.1"):
    return APIClient().post(
        "/api/auth/token/", {"username": username, "password": password}, REMOTE_ADDR=address
    )


def test_html_login_locks_out_after_the_limit(client, users):
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        response = html_login(client, "vera", "wrong")
        assert "didn't match" in response.content.decode()
    # Even the right password is refused now, with a clear message.
    response = html_login(client, "vera", GOOD)
    assert response.status_code == 200
    assert "Too many failed login attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_a_successful_login_resets_the_counter(client, users):
    for _ in range(settings.LOGIN_FAILURE_LIMIT - 1):
        html_login(client, "vera", "wrong")
    assert html_login(client, "vera", GOOD).status_code == 302
    client.logout()
    for _ in range(settings.LOGIN_FAILURE_LIMIT - 1):
        html_login(client, "vera", "wrong")
    assert html_login(client, "vera", GOOD).status_code == 302


def test_one_address_guessing_many_usernames_is_locked_out(client, users):
    for n in range(settings.LOGIN_FAILURE_LIMIT):
        html_login(client, f"guess{n}", "wrong", address="10.0.0.66")
    response = html_login(client, "vera", GOOD, address="10.0.0.66")
    assert "Too many failed login attempts" in response.content.decode()
    # The same user from another address is fine: only that address is locked.
    assert html_login(client, "vera", GOOD, address="10.0.0.7").status_code == 302


def test_one_username_guessed_from_many_addresses_is_locked_out(client, users):
    for n in range(settings.LOGIN_FAILURE_LIMIT):
        html_login(client, "vera", "wrong", address=f"10.0.1.{n}")
    response = html_login(client, "vera", GOOD, address="10.0.2.1")
    assert "Too many failed login attempts" in response.content.decode()
    assert html_login(client, "otto", GOOD, address="10.0.2.1").status_code == 302


def test_usernames_are_counted_case_insensitively(client, users):
    for name in ("Vera", "VERA", "vera", "vEra", "veRa"):
        html_login(client, name, "wrong", address=f"10.0.3.{len(name)}{name.count('e')}")
    assert auth_throttle.is_locked_out("vera", "")


def test_admin_login_locks_out_with_a_clear_message(client, users):
    admin_user = users[ADMIN]
    admin_user.is_staff = True
    admin_user.save()
    url = "/admin/login/?next=/admin/"
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        client.post(url, {"username": "ada", "password": "wrong"})
    response = client.post(url, {"username": "ada", "password": GOOD})
    assert response.status_code == 200
    assert "Too many failed login attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_api_token_answers_json_429_when_locked_out(users):
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        assert token("vera", "wrong").status_code == 400
    response = token("vera", GOOD)
    assert response.status_code == 429
    error = response.json()["error"]
    assert (error["status"], error["code"]) == (429, "locked_out")
    assert "Too many failed login attempts" in error["detail"]
    # Another user from another address still gets a token.
    assert token("otto", GOOD, address="10.0.0.8").status_code == 200


def test_token_success_resets_the_counter(users):
    for _ in range(settings.LOGIN_FAILURE_LIMIT - 1):
        token("vera", "wrong")
    assert token("vera", GOOD).status_code == 200
    assert auth_throttle.failures("vera", "127.0.0.1") == 0


@override_settings(LOGIN_FAILURE_LIMIT=2, LOGIN_FAILURE_WINDOW_S=1)
def test_limit_and_window_come_from_settings(client, users):
    html_login(client, "vera", "wrong")
    html_login(client, "vera", "wrong")
    assert "Too many failed login attempts" in html_login(client, "vera", GOOD).content.decode()
    time.sleep(1.5)  # the window is over: the counters have expired in Redis
    assert html_login(client, "vera", GOOD).status_code == 302


def test_the_cache_is_redis():
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    # Several web workers must share the counters: a per-process cache would multiply the limit.
    assert isinstance(caches["default"], RedisCache)
    assert auth_throttle.failures("nobody-yet", "192.0.2.1") == 0
