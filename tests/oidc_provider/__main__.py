"""The test provider's commands:

    python -m tests.oidc_provider setup < config.json   # database, signing key, client
    python -m tests.oidc_provider users < users.json    # create or update users and groups
    python -m tests.oidc_provider serve PORT

`config.json` is {"client_id", "client_secret", "redirect_uri"}; `users.json` maps a user name
to {"password", "groups"}: the groups are the provider's own Django groups, which its ID tokens
carry in the `groups` claim.
"""

import json
import os
import sys

import django

# Its own settings, whatever the parent process (pytest) had.
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.oidc_provider.settings"
django.setup()

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth.models import Group, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from oauth2_provider.models import Application  # noqa: E402


def setup(config: dict) -> None:
    """The database, an RSA signing key and Backstop's client registration."""
    call_command("migrate", verbosity=0)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    settings.KEY_FILE.write_bytes(pem)
    Application.objects.create(
        name="Backstop",
        client_id=config["client_id"],
        client_secret=config["client_secret"],  # hashed on save
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=config["redirect_uri"],
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=False,  # the consent page shows, as at most providers
    )


def users(accounts: dict) -> None:
    """Create or update each user with its password and exactly its groups."""
    for name, account in accounts.items():
        user, _ = User.objects.get_or_create(username=name, defaults={"email": f"{name}@corp"})
        user.set_password(account["password"])
        user.save()
        user.groups.set([Group.objects.get_or_create(name=group)[0] for group in account["groups"]])


def serve(port: int) -> None:
    """Django's development server, enough for one test client at a time."""
    call_command("runserver", f"127.0.0.1:{port}", use_reloader=False, skip_checks=True)


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "setup":
        setup(json.load(sys.stdin))
    elif command == "users":
        users(json.load(sys.stdin))
    elif command == "serve":
        serve(int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown command {command!r}")
