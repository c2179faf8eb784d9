"""Single sign-on through OpenID Connect, beside the local accounts (docs/ACCESS.md).

- `mapping`: pure functions, no Django: the group map's parsing, the groups claim to Django
  groups, the user name a new user gets;
- `backend`: the authentication backend that keeps signed-in users signed in;
- `accounts`: the Backstop user of a provider account and the synchronisation of its groups;
- `views`: the relying party (authorization-code flow with PKCE, state and nonce) and the login
  page with its "Sign in with ..." button.
"""

# The dotted path of the backend of single sign-on sessions: Django stores it in the session,
# the settings list it, the audit log tells these logins by it. Here, without imports, because
# the settings read it before Django is set up.
OIDC_BACKEND = "console.oidc.backend.OidcBackend"
