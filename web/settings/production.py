"""Production: SECRET_KEY is required, debug off, HTTPS only (HSTS, secure cookies, redirect).

`manage.py check --deploy` reports nothing with these settings (tests/web/test_deploy_check.py).
Behind a reverse proxy that terminates TLS, set SECURE_PROXY_SSL_HEADER (e.g.
`HTTP_X_FORWARDED_PROTO,https`) so Django knows the original request was HTTPS, and only if
the proxy overwrites that header on every request; see also TRUSTED_PROXIES in base.py.
"""

from spark_runtime.env import env, parse_bool, parse_list
from web.settings import base, inherit

inherit(globals(), base)


def _proxy_ssl_header(raw: str) -> tuple[str, str] | None:
    """`HEADER,value` (e.g. `HTTP_X_FORWARDED_PROTO,https`) as Django's tuple; empty for none."""
    parts = parse_list(raw)
    if not parts:
        return None
    if len(parts) != 2 or not parts[0].startswith("HTTP_"):
        raise ValueError(
            f"expected HTTP_HEADER_NAME,value such as HTTP_X_FORWARDED_PROTO,https, got {raw!r}"
        )
    return parts[0], parts[1]


SECRET_KEY = env("SECRET_KEY")
# The image collects the static files when it is built: a page naming a file the manifest lacks
# is an error here, never a plain link that nothing serves.
STORAGES = {
    **base.STORAGES,
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
DEBUG = False
SESSION_COOKIE_SECURE = env("SESSION_COOKIE_SECURE", True, parse_bool)
CSRF_COOKIE_SECURE = env("CSRF_COOKIE_SECURE", True, parse_bool)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_SSL_REDIRECT = env("SECURE_SSL_REDIRECT", True, parse_bool)
SECURE_PROXY_SSL_HEADER = env("SECURE_PROXY_SSL_HEADER", None, _proxy_ssl_header)
# One year; browsers then refuse plain HTTP for the host. Lower it while trying HTTPS out.
SECURE_HSTS_SECONDS = env("SECURE_HSTS_SECONDS", 31_536_000, int)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env("SECURE_HSTS_INCLUDE_SUBDOMAINS", True, parse_bool)
SECURE_HSTS_PRELOAD = env("SECURE_HSTS_PRELOAD", True, parse_bool)
# /healthz is polled by load balancers and container health checks over plain HTTP inside the
# network; everything else is redirected to HTTPS.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
