"""The Backstop user of a provider account: found by issuer and subject, its groups kept in step
with the groups claim. The whole sign-in against a real provider: tests/web/test_oidc_sso.py."""

import os
import subprocess
import sys

import pytest
from django.contrib.auth.models import Group

from console.models import OidcIdentity
from console.oidc.accounts import InvalidClaims, user_for_login
from console.roles import ADMIN, OPERATOR, role_of
from tests.factories import UserFactory

ISSUER = "https://idp.corp/realms/ops"
GROUP_MAP = {"sre-leads": ADMIN, "sre": OPERATOR, "payments": "team-payments"}


def sign_in(claims, issuer=ISSUER):
    return user_for_login(issuer, claims, groups_claim="groups", group_map=GROUP_MAP)


def group_names(user):
    return set(user.groups.values_list("name", flat=True))


@pytest.mark.django_db
def test_first_login_creates_a_user_without_a_password():
    user = sign_in({"sub": "u-1", "preferred_username": "ada", "email": "ada@corp", "groups": []})
    assert user.username == "ada"
    assert user.email == "ada@corp"
    assert not user.has_usable_password()
    assert OidcIdentity.objects.get(issuer=ISSUER, subject="u-1").user == user


@pytest.mark.django_db
def test_the_subject_not_the_name_or_email_finds_the_user():
    first = sign_in({"sub": "u-1", "preferred_username": "ada", "email": "ada@corp"})
    renamed = sign_in({"sub": "u-1", "preferred_username": "ada.l", "email": "ada.l@corp"})
    assert renamed.pk == first.pk
    assert renamed.email == "ada.l@corp"
    # Another account that took over the old name and address is another user.
    newcomer = sign_in({"sub": "u-2", "preferred_username": "ada", "email": "ada@corp"})
    assert newcomer.pk != first.pk
    # The same subject at another provider is another person.
    elsewhere = sign_in({"sub": "u-1", "preferred_username": "ada"}, issuer="https://other.idp")
    assert elsewhere.pk not in {first.pk, newcomer.pk}


@pytest.mark.django_db
def test_a_provider_account_never_takes_over_a_local_account_of_the_same_name():
    local = UserFactory(username="ada", role=ADMIN)
    user = sign_in({"sub": "u-1", "preferred_username": "ada", "groups": []})
    assert user.pk != local.pk
    assert user.username == "ada-2"
    assert role_of(user) is None
    assert role_of(local) == ADMIN


@pytest.mark.django_db
def test_groups_follow_the_claim_and_other_groups_stay():
    user = sign_in({"sub": "u-1", "groups": ["sre", "payments"]})
    assert group_names(user) == {OPERATOR, "team-payments"}
    assert role_of(user) == OPERATOR
    user.groups.add(Group.objects.create(name="oncall"))  # Backstop's own, not in the map

    user = sign_in({"sub": "u-1", "groups": ["sre-leads"]})
    assert group_names(user) == {ADMIN, "oncall"}
    assert role_of(user) == ADMIN

    user = sign_in({"sub": "u-1"})  # no groups claim at all
    assert group_names(user) == {"oncall"}
    assert role_of(user) is None


@pytest.mark.django_db
def test_claims_without_a_subject_are_refused():
    with pytest.raises(InvalidClaims):
        sign_in({"preferred_username": "ada", "groups": ["sre-leads"]})
    assert not OidcIdentity.objects.exists()


@pytest.mark.django_db
def test_with_single_sign_on_off_the_login_page_is_local_only(client, settings):
    settings.OIDC_ISSUER = ""
    page = client.get("/accounts/login/")
    assert page.status_code == 200
    assert b"Sign in with" not in page.content
    assert b'name="password"' in page.content
    assert client.get("/accounts/oidc/login/").status_code == 404
    assert client.get("/accounts/oidc/callback/?code=x&state=y").status_code == 404


def _import_settings(**environ) -> subprocess.CompletedProcess:
    names = ("OIDC_ISSUER", "OIDC_CLIENT_ID", "OIDC_CLIENT_SECRET", "OIDC_GROUP_MAP")
    env_vars = {k: v for k, v in os.environ.items() if k not in names}
    env_vars.update(environ)
    return subprocess.run(
        [sys.executable, "-c", "import web.settings.base as s; print(s.AUTHENTICATION_BACKENDS)"],
        capture_output=True,
        text=True,
        env=env_vars,
        check=False,
    )


def test_settings_turn_single_sign_on_on_only_when_complete():
    off = _import_settings()
    assert off.returncode == 0, off.stderr
    assert "OidcBackend" not in off.stdout

    on = _import_settings(
        OIDC_ISSUER="https://idp.corp", OIDC_CLIENT_ID="backstop", OIDC_CLIENT_SECRET="s"
    )
    assert on.returncode == 0, on.stderr
    assert "console.oidc.backend.OidcBackend" in on.stdout

    no_secret = _import_settings(OIDC_ISSUER="https://idp.corp", OIDC_CLIENT_ID="backstop")
    assert no_secret.returncode != 0
    assert "OIDC_CLIENT_SECRET" in no_secret.stderr

    bad_map = _import_settings(OIDC_GROUP_MAP='["admin"]')
    assert bad_map.returncode != 0
    assert "OIDC_GROUP_MAP" in bad_map.stderr
