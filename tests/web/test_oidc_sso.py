"""Single sign-on end to end against a real OpenID Connect provider.

The provider is django-oauth-toolkit's (a maintained authorization server from PyPI) in a tiny
Django project of its own (tests/oidc_provider), started once for this module as a separate
process on 127.0.0.1. Backstop is the live server. A requests session plays the browser: it
follows every real redirect, console -> provider's login form -> consent page -> Backstop's
callback, and submits the forms as a person would.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlparse, urlunparse

import pytest
import requests

from console.models import AuditEvent, OidcIdentity
from console.oidc import OIDC_BACKEND
from console.roles import ADMIN, OPERATOR, VIEWER, role_of
from tests.factories import UserFactory

REPO = Path(__file__).resolve().parents[2]
CLIENT_ID = "backstop-console"
CLIENT_SECRET = "backstop-test-secret"
GROUP_MAP = {"sre-leads": ADMIN, "sre": OPERATOR, "payments": "team-payments"}
PASSWORD = "provider-pw"
# The provider's accounts and their groups there (the ID token's `groups` claim).
ACCOUNTS = {
    "alice": ["sre-leads", "wiki-editors"],
    "oscar": ["sre", "payments"],
    "nora": ["marketing"],
    "tom": ["sre"],
}
TIMEOUT_S = 10


class Provider:
    """The running test provider: its issuer URL, and its users' groups to change."""

    def __init__(self, issuer: str, env: dict[str, str]):
        self.issuer = issuer
        self.origin = issuer.rsplit("/o", 1)[0]
        self.env = env

    def run(self, *args: str, stdin: dict) -> None:
        subprocess.run(
            [sys.executable, "-m", "tests.oidc_provider", *args],
            input=json.dumps(stdin),
            text=True,
            cwd=REPO,
            env=self.env,
            check=True,
            capture_output=True,
            timeout=60,
        )

    def set_groups(self, username: str, groups: list[str]) -> None:
        self.run("users", stdin={username: {"password": PASSWORD, "groups": groups}})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def provider(live_server, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("oidc-provider")
    port = _free_port()
    issuer = f"http://127.0.0.1:{port}/o"
    env = {
        **os.environ,
        "OIDC_TEST_PROVIDER_DIR": str(data_dir),
        "OIDC_TEST_PROVIDER_ISSUER": issuer,
    }
    provider = Provider(issuer, env)
    provider.run(
        "setup",
        stdin={
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "redirect_uri": f"{live_server.url}/accounts/oidc/callback/",
        },
    )
    provider.run(
        "users",
        stdin={name: {"password": PASSWORD, "groups": groups} for name, groups in ACCOUNTS.items()},
    )
    log = (data_dir / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.oidc_provider", "serve", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_up(issuer + "/.well-known/openid-configuration", server)
        yield provider
    finally:
        server.terminate()  # by its pid: the one process this fixture started
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        log.close()


def _wait_until_up(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert server.poll() is None, "the test provider exited at start-up"
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"the test provider did not answer {url} within 30 s")


@pytest.fixture
def sso(settings, provider, transactional_db):
    """Single sign-on on, against the test provider, as the environment would set it."""
    settings.OIDC_ISSUER = provider.issuer
    settings.OIDC_CLIENT_ID = CLIENT_ID
    settings.OIDC_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_PROVIDER_NAME = "Test IdP"
    settings.OIDC_SCOPES = "openid profile email"
    settings.OIDC_GROUPS_CLAIM = "groups"
    settings.OIDC_GROUP_MAP = GROUP_MAP
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS, OIDC_BACKEND]
    return provider


class _Forms(HTMLParser):
    """The forms of a page: action and the fields a browser would send (submit buttons aside)."""

    def __init__(self):
        super().__init__()
        self.forms: list[dict] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.forms.append({"action": attrs.get("action") or "", "fields": {}})
        elif tag == "input" and self.forms and attrs.get("name") and attrs.get("type") != "submit":
            self.forms[-1]["fields"][attrs["name"]] = attrs.get("value") or ""


def _only_form(page: requests.Response) -> dict:
    parser = _Forms()
    parser.feed(page.text)
    assert len(parser.forms) == 1, f"expected one form at {page.url}: {page.text[:500]}"
    return parser.forms[0]


def through_provider(
    session: requests.Session,
    page: requests.Response,
    provider: Provider,
    username: str,
    *,
    approve: bool = True,
    follow_callback: bool = True,
) -> requests.Response:
    """Sign in at the provider's login form and answer its consent page, as a person would,
    from `page` (where the console sent the browser) on, until the provider lets go; with
    `follow_callback` false, the provider's redirect to the callback is returned unfollowed."""
    for _ in range(4):  # login form, consent page; more means the provider refused
        if not page.url.startswith(provider.origin):
            return page
        form = _only_form(page)
        fields = form["fields"]
        consent = "password" not in fields
        if not consent:
            fields.update(username=username, password=PASSWORD)
        elif approve:
            fields["allow"] = "Authorize"
        page = session.post(
            urljoin(page.url, form["action"]),
            data=fields,
            allow_redirects=follow_callback or not consent,
            timeout=TIMEOUT_S,
        )
        if consent and not follow_callback:
            return page
    raise AssertionError(f"still at the provider after signing in: {page.url}")


def sso_login(
    base_url: str, provider: Provider, username: str, **options
) -> tuple[requests.Session, requests.Response]:
    """A fresh browser's single sign-on from the console's login page's button: the browser and
    the page it lands on."""
    session = requests.Session()
    login_page = session.get(f"{base_url}/accounts/login/?next=/", timeout=TIMEOUT_S)
    assert "Sign in with Test IdP" in login_page.text
    button = urljoin(login_page.url, _sso_href(login_page.text))
    first = session.get(button, timeout=TIMEOUT_S)
    assert first.url.startswith(provider.origin + "/accounts/login/")
    return session, through_provider(session, first, provider, username, **options)


def _sso_href(html: str) -> str:
    start = html.index('id="sso-login" href="') + len('id="sso-login" href="')
    return html[start : html.index('"', start)].replace("&amp;", "&")


def _user(username: str):
    return OidcIdentity.objects.get(user__username=username).user


def test_a_lead_signs_in_as_admin_and_the_audit_log_says_so(sso, live_server, caplog):
    caplog.set_level(logging.INFO, logger="backstop.audit")
    _, landing = sso_login(live_server.url, sso, "alice")

    assert landing.status_code == 200
    assert urlparse(landing.url).path == "/"
    assert 'alice <span class="role">admin</span>' in landing.text
    identity = OidcIdentity.objects.get()
    assert identity.issuer == sso.issuer
    user = identity.user
    assert (user.username, user.email) == ("alice", "alice@corp")
    assert not user.has_usable_password()
    assert role_of(user) == ADMIN
    assert set(user.groups.values_list("name", flat=True)) == {ADMIN}  # wiki-editors: unmapped
    assert any(
        line.startswith("login username='alice' address=127.0.0.1 method=oidc")
        for line in caplog.messages
    ), caplog.messages
    # The audit log has the sign-in and the role the group mapping gave, with the address.
    login = AuditEvent.objects.get(action="login")
    assert (login.actor, login.address, login.detail) == (user, "127.0.0.1", {"method": "oidc"})
    joined = AuditEvent.objects.get(action="role.add", target="user:alice")
    assert (joined.detail, joined.address) == ({"group": ADMIN}, "127.0.0.1")


def test_operator_with_a_team_loses_operator_when_the_claim_drops_it(sso, live_server):
    _, landing = sso_login(live_server.url, sso, "oscar")
    assert 'oscar <span class="role">operator</span>' in landing.text
    user = _user("oscar")
    assert set(user.groups.values_list("name", flat=True)) == {OPERATOR, "team-payments"}
    # A group of Backstop's own, which the map does not name, survives the next login.
    user.groups.create(name="oncall")

    sso.set_groups("oscar", ["payments"])  # left the SRE team at the provider
    _, landing = sso_login(live_server.url, sso, "oscar")

    assert 'oscar <span class="role">no role</span>' in landing.text
    user.refresh_from_db()
    assert set(user.groups.values_list("name", flat=True)) == {"team-payments", "oncall"}
    assert role_of(user) is None
    assert OidcIdentity.objects.filter(user=user).count() == 1


def test_a_user_with_no_mapped_group_gets_in_with_no_role(sso, live_server):
    browser, landing = sso_login(live_server.url, sso, "nora")

    assert 'nora <span class="role">no role</span>' in landing.text
    assert role_of(_user("nora")) is None
    # Signed in, but every page that needs a role refuses.
    assert browser.get(f"{live_server.url}/api/jobs/", timeout=TIMEOUT_S).status_code == 403


def test_a_tampered_state_is_refused_with_a_clear_message(sso, live_server, caplog):
    caplog.set_level(logging.INFO, logger="backstop.audit")
    session = requests.Session()
    first = session.get(f"{live_server.url}/accounts/oidc/login/", timeout=TIMEOUT_S)
    redirect = through_provider(session, first, sso, "tom", follow_callback=False)
    callback = urlparse(redirect.headers["Location"])
    assert callback.path == "/accounts/oidc/callback/"
    query = parse_qs(callback.query)
    assert query["code"] and query["state"]
    query["state"] = ["forged-" + query["state"][0]]
    tampered = urlunparse(callback._replace(query=urlencode(query, doseq=True)))

    page = session.get(tampered, timeout=TIMEOUT_S)

    assert urlparse(page.url).path == "/accounts/login/"
    assert "does not belong to a sign-in started here" in page.text
    assert "Traceback" not in page.text
    assert not OidcIdentity.objects.exists()
    assert session.get(f"{live_server.url}/", timeout=TIMEOUT_S).url.endswith(
        "/accounts/login/?next=/"
    )
    assert any(
        "login-failed username=None address=127.0.0.1 method=oidc reason='state mismatch'" in line
        for line in caplog.messages
    ), caplog.messages
    refused = AuditEvent.objects.get(action="login.failed")
    assert refused.detail == {"method": "oidc", "reason": "state mismatch"}


def test_consent_refused_at_the_provider_says_so(sso, live_server):
    _, landing = sso_login(live_server.url, sso, "tom", approve=False)

    assert urlparse(landing.url).path == "/accounts/login/"
    assert "Single sign-on was cancelled at the provider." in landing.text
    assert not OidcIdentity.objects.exists()


def test_a_token_the_provider_will_not_issue_is_refused(sso, live_server, settings):
    settings.OIDC_CLIENT_SECRET = "not-the-registered-secret"
    _, landing = sso_login(live_server.url, sso, "tom")

    assert urlparse(landing.url).path == "/accounts/login/"
    assert "the provider refused the sign-in" in landing.text
    assert not OidcIdentity.objects.exists()


def test_an_id_token_from_another_issuer_is_refused(sso, live_server, settings):
    # The same provider's discovery document, but Backstop expects another issuer in the
    # ID token than the provider signs ("/o/" instead of "/o"): the token does not verify.
    settings.OIDC_ISSUER = sso.issuer + "/"
    _, landing = sso_login(live_server.url, sso, "tom")

    assert urlparse(landing.url).path == "/accounts/login/"
    assert "answer could not be verified" in landing.text
    assert not OidcIdentity.objects.exists()


def test_local_password_login_still_works_beside_it(sso, live_server):
    UserFactory(username="vera", password="local-pw", role=VIEWER)
    session = requests.Session()
    login_page = session.get(f"{live_server.url}/accounts/login/", timeout=TIMEOUT_S)
    assert "Sign in with Test IdP" in login_page.text
    fields = _only_form_named(login_page.text, "csrfmiddlewaretoken")
    fields.update(username="vera", password="local-pw", next="/")

    landing = session.post(login_page.url, data=fields, timeout=TIMEOUT_S)

    assert urlparse(landing.url).path == "/"
    assert 'vera <span class="role">viewer</span>' in landing.text


def _only_form_named(html: str, field: str) -> dict:
    """The fields of the page's form that has `field` (the local login form)."""
    parser = _Forms()
    parser.feed(html)
    (form,) = [form for form in parser.forms if field in form["fields"]]
    return form["fields"]
