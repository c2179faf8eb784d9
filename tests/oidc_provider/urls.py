"""The test provider's URLs (its login page, django-oauth-toolkit's endpoints under /o/) and the
validator that puts the user's groups in the ID token."""

from django.contrib.auth import views as auth_views
from django.urls import include, path
from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsClaimValidator(OAuth2Validator):
    """django-oauth-toolkit's validator, adding the user's groups, user name and email to the ID
    token for the `profile` and `email` scopes (as most providers do with a groups mapper)."""

    oidc_claim_scope = {
        **OAuth2Validator.oidc_claim_scope,
        "groups": "profile",
        "preferred_username": "profile",
        "email": "email",
    }

    def get_additional_claims(self, request):
        user = request.user
        return {
            "groups": sorted(user.groups.values_list("name", flat=True)),
            "preferred_username": user.username,
            "email": user.email,
        }


urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
]
