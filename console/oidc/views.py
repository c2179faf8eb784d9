"""The OpenID Connect relying party: the login page's "Sign in with ..." button, the redirect to
the provider and the callback that signs the user in.

Authlib does the protocol: discovery from OIDC_ISSUER's /.well-known/openid-configuration, the
authorization-code flow with PKCE (S256), state and nonce kept in the session, and the ID token's
signature checked against the provider's JWKS (fetched again when a token names an unknown key,
so the provider may rotate its keys), its issuer, audience, expiry and nonce.

Single sign-on is on when OIDC_ISSUER is set; off, these URLs answer 404 and the login page has
the local form only. Every refused callback is logged like a failed login (user_login_failed,
so the audit log and the address's failure counter see it) and explained on the login page.
"""

from __future__ import annotations

import functools
import logging

import requests
from authlib.common.errors import AuthlibBaseError
from authlib.integrations.base_client import MismatchingStateError, OAuthError
from authlib.integrations.django_client import DjangoOAuth2App, OAuth
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.signals import user_login_failed
from django.contrib.auth.views import LoginView
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from joserfc.errors import JoseError

from console.oidc import OIDC_BACKEND
from console.oidc.accounts import InvalidClaims, user_for_login

log = logging.getLogger(__name__)

# Where the page asked for before the login goes, kept in the session across the provider.
NEXT_SESSION_KEY = "oidc_next"
DISCOVERY_PATH = "/.well-known/openid-configuration"
# Seconds to wait for the provider on each back-channel request (discovery, token, JWKS).
PROVIDER_TIMEOUT_S = 10


def sso_enabled() -> bool:
    """True when OIDC_ISSUER is set."""
    return bool(settings.OIDC_ISSUER)


def discovery_url(issuer: str) -> str:
    """The provider's discovery document (OpenID Connect Discovery 1.0, section 4)."""
    return issuer.rstrip("/") + DISCOVERY_PATH


@functools.lru_cache(maxsize=4)
def _client(issuer: str, client_id: str, client_secret: str, scopes: str) -> DjangoOAuth2App:
    # One client per configuration, so the discovery document and JWKS are fetched once per
    # process, not at every login.
    return OAuth().register(
        name="backstop-oidc",
        client_id=client_id,
        client_secret=client_secret,
        server_metadata_url=discovery_url(issuer),
        client_kwargs={
            "scope": scopes,
            "code_challenge_method": "S256",
            "default_timeout": PROVIDER_TIMEOUT_S,
        },
    )


def oidc_client() -> DjangoOAuth2App:
    """The Authlib client of the provider the settings name."""
    return _client(
        settings.OIDC_ISSUER,
        settings.OIDC_CLIENT_ID,
        settings.OIDC_CLIENT_SECRET,
        settings.OIDC_SCOPES,
    )


class SsoLoginView(LoginView):
    """Django's login page with the "Sign in with <provider>" button while single sign-on is on."""

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["sso_provider_name"] = settings.OIDC_PROVIDER_NAME if sso_enabled() else None
        return context


@never_cache
def oidc_login(request):
    """Send the browser to the provider's authorization endpoint, with a fresh state, nonce and
    PKCE verifier kept in the session."""
    if not sso_enabled():
        raise Http404("single sign-on is off")
    next_url = request.GET.get("next", "")
    safe = url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    request.session[NEXT_SESSION_KEY] = next_url if safe else ""
    try:
        return oidc_client().authorize_redirect(
            request, request.build_absolute_uri(reverse("oidc-callback"))
        )
    except (requests.RequestException, AuthlibBaseError, ValueError, RuntimeError) as exc:
        # Discovery failed: the provider is down, or its document is not what OIDC promises.
        return _refuse(request, "the provider could not be reached", exc, PROVIDER_DOWN)


@never_cache
def oidc_callback(request):
    """The provider's redirect back: check state, exchange the code (with the PKCE verifier),
    verify the ID token, then sign in the user it names with its groups mapped."""
    if not sso_enabled():
        raise Http404("single sign-on is off")
    client = oidc_client()
    try:
        token = client.authorize_access_token(
            request,
            # The issuer configured here, not only the one the discovery document claims; and
            # this client among the audience (Authlib alone checks `aud` only through `azp`).
            claims_options={
                "iss": {"essential": True, "value": settings.OIDC_ISSUER},
                "aud": {"essential": True, "value": settings.OIDC_CLIENT_ID},
            },
        )
    except MismatchingStateError as exc:
        return _refuse(request, "state mismatch", exc, STATE_MISMATCH)
    except OAuthError as exc:
        if exc.error == "access_denied":
            return _refuse(request, "denied at the provider", exc, DENIED)
        return _refuse(request, f"provider error {exc.error or ''}".strip(), exc, PROVIDER_ERROR)
    except (JoseError, AuthlibBaseError) as exc:
        return _refuse(request, "invalid ID token", exc, INVALID_TOKEN)
    except (requests.RequestException, ValueError, RuntimeError) as exc:
        return _refuse(request, "the provider could not be reached", exc, PROVIDER_DOWN)
    claims = token.get("userinfo")
    if not claims:
        return _refuse(request, "no ID token", None, INVALID_TOKEN)
    try:
        user = user_for_login(
            settings.OIDC_ISSUER,
            claims,
            groups_claim=settings.OIDC_GROUPS_CLAIM,
            group_map=settings.OIDC_GROUP_MAP,
        )
    except InvalidClaims as exc:
        return _refuse(request, str(exc), exc, INVALID_TOKEN)
    if not user.is_active:
        return _refuse(request, "account disabled", None, DISABLED, username=user.username)
    next_url = request.session.pop(NEXT_SESSION_KEY, "")
    login(request, user, backend=OIDC_BACKEND)  # sends user_logged_in: the audit log's line
    return HttpResponseRedirect(next_url or settings.LOGIN_REDIRECT_URL)


# What the login page says; the reason in the log says more.
STATE_MISMATCH = (
    "Single sign-on failed: the answer from the provider does not belong to a sign-in started "
    "here (it expired, or it was changed on the way). Please sign in again."
)
DENIED = "Single sign-on was cancelled at the provider."
PROVIDER_ERROR = "Single sign-on failed: the provider refused the sign-in. Please try again."
INVALID_TOKEN = (
    "Single sign-on failed: the provider's answer could not be verified. Please try again, or "
    "tell your administrator if it keeps failing."
)
PROVIDER_DOWN = "Single sign-on failed: the provider could not be reached. Please try again later."
DISABLED = "Single sign-on failed: this account is disabled in Backstop."


def _refuse(request, reason: str, exc: Exception | None, message: str, username=None):
    """Log a refused sign-in like a failed login and go back to the login page saying why."""
    if exc is not None:
        log.warning("single sign-on refused (%s): %s: %s", reason, type(exc).__name__, exc)
    user_login_failed.send(
        sender=__name__,
        credentials={"username": username, "method": "oidc", "reason": reason},
        request=request,
    )
    messages.error(request, message)
    return redirect("login")
