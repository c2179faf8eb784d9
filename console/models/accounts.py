"""Accounts signed in through OpenID Connect: which provider account is which Backstop user."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class OidcIdentity(models.Model):
    """An account at an OpenID Connect provider, named by the provider's issuer URL and its
    `sub` claim, and the Backstop user it signs in as.

    The pair (issuer, subject) is what the provider promises never to reassign, unlike an email
    address or a user name, so a person renamed at the provider keeps their Backstop user, and an
    address reused by someone else does not hand them that user.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identities"
    )
    issuer = models.CharField(max_length=255)
    # OpenID Connect Core 1.0, section 2: `sub` is at most 255 ASCII characters.
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_unique_sub")
        ]
        verbose_name = "OpenID Connect identity"
        verbose_name_plural = "OpenID Connect identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
