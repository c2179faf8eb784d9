"""The authentication backend of users signed in through OpenID Connect."""

from __future__ import annotations

from django.contrib.auth.backends import ModelBackend


class OidcBackend(ModelBackend):
    """Keeps users that the OpenID Connect callback signed in signed in, and gives them the
    permissions of their groups, like ModelBackend.

    It never authenticates anyone by itself: the callback verifies the provider's ID token and
    then calls django.contrib.auth.login() naming this backend. So no caller of authenticate()
    can sign in by handing it claims, and passwords are checked only by ThrottledModelBackend.
    It is listed in AUTHENTICATION_BACKENDS only while single sign-on is on: turning it off ends
    the sessions opened through it.
    """

    def authenticate(self, request, **credentials):
        return None
