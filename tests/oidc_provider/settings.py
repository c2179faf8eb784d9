"""Settings of the test provider's Django project (see __main__.py).

OIDC_TEST_PROVIDER_DIR names the directory of its SQLite database and RSA signing key,
OIDC_TEST_PROVIDER_ISSUER its issuer URL (`http://127.0.0.1:PORT/o`).
"""

import os
from pathlib import Path

DATA_DIR = Path(os.environ.get("OIDC_TEST_PROVIDER_DIR", "."))
KEY_FILE = DATA_DIR / "signing-key.pem"

DEBUG = False
SECRET_KEY = "test-provider-only"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
ROOT_URLCONF = "tests.oidc_provider.urls"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.staticfiles",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [Path(__file__).parent / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
    }
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "provider.sqlite3",
        "OPTIONS": {"timeout": 20},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STATIC_URL = "/static/"
USE_TZ = True
LOGIN_URL = "/accounts/login/"
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_ISS_ENDPOINT": os.environ.get("OIDC_TEST_PROVIDER_ISSUER", ""),
    "OIDC_RSA_PRIVATE_KEY": KEY_FILE.read_text() if KEY_FILE.exists() else "",
    # Backstop must send a PKCE challenge, or the provider refuses.
    "PKCE_REQUIRED": True,
    "OAUTH2_VALIDATOR_CLASS": "tests.oidc_provider.urls.GroupsClaimValidator",
    "SCOPES": {"openid": "OpenID Connect", "profile": "Profile", "email": "Email"},
}
