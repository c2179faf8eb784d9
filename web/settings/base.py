"""Settings shared by every environment. Values that vary come from the environment via `env()`."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import urlparse

import dj_database_url

from console.oidc import OIDC_BACKEND
from console.oidc.mapping import parse_group_map
from infra.kafka import kafka_bootstrap_servers
from spark_runtime.config import spark_log_level
from spark_runtime.env import ImproperlyConfiguredEnv, env, parse_bool, parse_list, parse_url

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(env("BACKSTOP_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)  # SQLite file, logs, checkpoints of the demo

SECRET_KEY = env("SECRET_KEY", "insecure-local-key-change-me")
DEBUG = env("DEBUG", False, parse_bool)
ALLOWED_HOSTS = env("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"], parse_list)
CSRF_TRUSTED_ORIGINS = env("CSRF_TRUSTED_ORIGINS", [], parse_list)


def _networks(raw: str) -> list[str]:
    """Comma-separated addresses or CIDR blocks, each checked (a typo must not trust everyone)."""
    entries = parse_list(raw)
    for entry in entries:
        ipaddress.ip_network(entry, strict=False)  # raises ValueError naming the bad entry
    return entries


# Reverse proxies in front of the web server (addresses or CIDR blocks, e.g.
# "10.0.0.5,172.16.0.0/12"). X-Forwarded-For is believed only from these
# (console.middleware.TrustedProxyMiddleware); empty: never, REMOTE_ADDR is the client.
TRUSTED_PROXIES = env("TRUSTED_PROXIES", [], _networks)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "django_plotly_dash.apps.DjangoPlotlyDashConfig",
    "console",
    "bench",
]

MIDDLEWARE = [
    # First, so every later step sees the real client address in REMOTE_ADDR.
    "console.middleware.TrustedProxyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files straight from the server process (collected, hashed names, compressed), before
    # sessions and the database are touched: no separate file server in the demo or a container.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before anything reads the body: 413 over DATA_UPLOAD_MAX_MEMORY_SIZE, 400 past JSON_MAX_DEPTH.
    "console.middleware.RequestBodyLimitsMiddleware",
    "console.middleware.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # After authentication: writes recorded in the audit log take the address from the request.
    "console.middleware.AuditRequestMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_plotly_dash.middleware.BaseMiddleware",
    "console.middleware.SharedDataInvalidationMiddleware",
    "console.middleware.ApiJsonErrorsMiddleware",
]

# Request bodies: larger ones get a JSON 413, JSON nested deeper a JSON 400 (console.middleware).
DATA_UPLOAD_MAX_MEMORY_SIZE = env("DATA_UPLOAD_MAX_MEMORY_SIZE", 2_621_440, int)
JSON_MAX_DEPTH = env("JSON_MAX_DEPTH", 64, int)

ROOT_URLCONF = "web.urls"
WSGI_APPLICATION = "web.wsgi.application"
ASGI_APPLICATION = "web.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.role",
                "console.context_processors.policy_version",
            ],
        },
    },
]

# SQLite file by default (zero-setup demo); PostgreSQL through psycopg2 with
# DATABASE_URL=postgres://user@host:5432/name.
DATABASE_URL = env(
    "DATABASE_URL",
    f"sqlite:///{VAR_DIR / 'backstop.sqlite3'}",
    parse_url(("sqlite", "postgres", "postgresql", "pgsql")),
)


def database_settings(url: str) -> dict:
    """Django's settings for the database at `url` (also used by the tests that start a
    database of their own)."""
    # Health checks: a kept connection is checked (SELECT 1) before each request reuses it, so
    # the first request after a database restart reconnects instead of failing.
    conf = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    if conf["ENGINE"] == "django.db.backends.sqlite3":
        # Several processes (web, controller, beat, agents) share the demo's SQLite file: wait
        # for locks instead of failing at once. IMMEDIATE takes the write lock when a
        # transaction begins: a deferred one that read first (select_for_update is a plain
        # SELECT here) and then writes fails at once with "database is locked" when another
        # process writes meanwhile, without waiting for the timeout (the demo's job launch
        # failed that way).
        conf["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}
        conf["CONN_MAX_AGE"] = 0
    return conf


DATABASES = {"default": database_settings(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]


def _issuer_url(raw: str) -> str:
    """An http(s) URL with a host ('' turns single sign-on off)."""
    parsed = urlparse(raw)
    if raw and not (parsed.scheme in {"http", "https"} and parsed.hostname):
        raise ValueError(f"expected the provider's issuer URL (https://...), got {raw!r}")
    return raw


def _oidc_scopes(raw: str) -> str:
    """Space-separated scopes, which must ask for `openid` (else no ID token comes back)."""
    if "openid" not in raw.split():
        raise ValueError(f"the scopes must include openid, got {raw!r}")
    return " ".join(raw.split())


# Single sign-on through OpenID Connect (docs/ACCESS.md), on when OIDC_ISSUER is set: the
# provider's issuer URL, exactly as its discovery document and ID tokens give it.
OIDC_ISSUER = env("OIDC_ISSUER", "", _issuer_url)
OIDC_CLIENT_ID = env("OIDC_CLIENT_ID", "")
OIDC_CLIENT_SECRET = env("OIDC_CLIENT_SECRET", "")
if OIDC_ISSUER and not (OIDC_CLIENT_ID and OIDC_CLIENT_SECRET):
    raise ImproperlyConfiguredEnv(
        "OIDC_ISSUER is set: OIDC_CLIENT_ID and OIDC_CLIENT_SECRET are required too"
    )
# The login page's button says "Sign in with <OIDC_PROVIDER_NAME>".
OIDC_PROVIDER_NAME = env("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_SCOPES = env("OIDC_SCOPES", "openid profile email", _oidc_scopes)
# The ID token's claim listing the user's groups at the provider, and which of its values make
# the user a member of which Django group (a role: viewer, operator, admin; or a team).
OIDC_GROUPS_CLAIM = env("OIDC_GROUPS_CLAIM", "groups")
OIDC_GROUP_MAP = env("OIDC_GROUP_MAP", {}, parse_group_map)

# The throttled backend refuses logins for a username or address that failed too often; the
# failures are counted in the shared cache (see console.auth_throttle). The OpenID Connect
# backend only keeps single sign-on sessions (it checks no password); without it, as when single
# sign-on is turned off, those sessions end.
AUTHENTICATION_BACKENDS = ["console.auth_throttle.ThrottledModelBackend"]
if OIDC_ISSUER:
    AUTHENTICATION_BACKENDS.append(OIDC_BACKEND)


def _positive_int(raw: str) -> int:
    """An integer >= 1 (a limit or window of 0 would lock everyone out or nobody)."""
    value = int(raw)
    if value < 1:
        raise ValueError(f"expected an integer >= 1, got {raw!r}")
    return value


LOGIN_FAILURE_LIMIT = env("LOGIN_FAILURE_LIMIT", 5, _positive_int)
LOGIN_FAILURE_WINDOW_S = env("LOGIN_FAILURE_WINDOW_S", 900, _positive_int)
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# `collectstatic` writes each file also under a name with its content hash (backstop.3f2a….css)
# plus gzip and brotli copies; pages link the hashed names, which WhiteNoise serves with a
# one-year immutable Cache-Control, so a browser fetches each version of a file once. Before
# anything was collected (a fresh clone), pages link the plain names (web/staticfiles.py).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "web.staticfiles.ManifestOnceCollected"},
}
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "django_plotly_dash.finders.DashAssetFinder",
    "django_plotly_dash.finders.DashComponentFinder",
]

# Security headers on every response: nosniff, no referrer to other sites, and a CSP. Scripts
# come from this site only; the one inline script is Dash's renderer start-up,
# `var renderer = new DashRenderer();`, allowed by its hash (tests/dash/test_dash_access.py checks
# that every inline script of every console page matches a hash listed here). Plotly sets inline
# styles and draws images from data: URLs.
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
DASH_RENDERER_SCRIPT_HASH = "sha256-jZlsGVOhUAIcH+4PVs7QuGZkthRMgvT2n0ilH6/zTM0="
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        f"script-src 'self' '{DASH_RENDERER_SCRIPT_HASH}'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data: blob:",
        "font-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

# No page is ever framed: the Dash apps are rendered into the Django pages (plotly_direct), not
# in iframes.
X_FRAME_OPTIONS = "DENY"
PLOTLY_DASH = {
    "serve_locally": True,
    "cache_timeout_initial_arguments": 60,
    # Dash endpoints need a session with a role and, for callback updates, a CSRF token.
    "view_decorator": "console.dash.access.console_access",
}
# Dash's renderer sends the X-CSRFToken header from a cookie of this name; Django's forms and
# checks follow the setting, so the console and Dash share one token.
CSRF_COOKIE_NAME = "_csrf_token"

REDIS_URL = env("REDIS_URL", "redis://127.0.0.1:6379/0", parse_url(("redis", "rediss", "unix")))
# The Kafka cluster of jobs with a Kafka source or sink (None: such jobs are refused). The demo,
# the benchmarks and the test clusters start a broker and set it for the processes they start.
KAFKA_BOOTSTRAP_SERVERS = kafka_bootstrap_servers()


def cache_settings(redis_url: str) -> dict:
    """Django's RedisCache on `redis_url`: every web worker shares counters such as login failures
    and API request rates. Values are JSON (console.cache.JSONSerializer), never pickles: the
    stage processes, which run users' code, reach this Redis.

    Environment modules that change REDIS_URL (test.py) call this again with their own URL.
    """
    return {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_url,
            "KEY_PREFIX": "backstop",
            "OPTIONS": {"serializer": "console.cache.JSONSerializer"},
        }
    }


CACHES = cache_settings(REDIS_URL)
# Sessions in the database only: a session in Redis could be read, or one made up for an admin,
# by any stage process (users' job code), which is given the Redis URL. A session is read by
# its primary key once per request.
SESSION_ENGINE = "django.contrib.sessions.backends.db"

# What DRF reads as a period: the first letter of one of these.
THROTTLE_PERIODS = {"s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day"}


def _throttle_rate(raw: str) -> str | None:
    """DRF's rate, `N/second`, `N/minute`, `N/hour` or `N/day` (s, min, h, d for short), or
    `off` for no limit."""
    text = raw.strip().lower()
    if text in {"off", "none", ""}:
        return None
    count, _, period = text.partition("/")
    if not count.isdigit() or int(count) < 1 or period not in THROTTLE_PERIODS:
        raise ValueError(f"expected a rate such as 6000/min or 100/s, or off, got {raw!r}")
    return f"{int(count)}/{period}"


# Requests per user (or, before authentication, per client address) to the API, counted in the
# shared cache across web workers; over it, 429 with Retry-After (console/api/throttling.py).
# 6000/min lets the documented load test (50 clients of one user, 75 requests/s) through.
API_THROTTLE_RATES = {
    "user": env("API_THROTTLE_USER", "6000/min", _throttle_rate),
    "anon": env("API_THROTTLE_ANON", "120/min", _throttle_rate),
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["console.api.permissions.RolePermission"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "console.api.exceptions.json_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "console.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
    "DEFAULT_THROTTLE_CLASSES": [
        "console.api.throttling.UserThrottle",
        "console.api.throttling.AnonThrottle",
    ],
    # The same rates; the throttles read API_THROTTLE_RATES at each request instead of DRF's
    # copy made at import (console/api/throttling.py), so a changed setting takes effect.
    "DEFAULT_THROTTLE_RATES": API_THROTTLE_RATES,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Backstop API",
    "DESCRIPTION": "Launch and supervise PySpark Structured Streaming jobs, inject faults, "
    "read recoveries and thresholds.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Serve Swagger UI from the installed sidecar package: the console works without internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Two models have a `mode` with choices: each enum gets a name of its own.
    "ENUM_NAME_OVERRIDES": {
        "OperatorModeEnum": "console.models.jobs.Operator.Mode",
        "UpgradeModeEnum": "console.models.upgrades.JobUpgrade.Mode",
        "AlertDeliveryActionEnum": "console.models.alerting.AlertDelivery.Action",
        "AlertEventEnum": "console.models.alerting.EVENT_CHOICES",
        "AlertSeverityEnum": "console.models.alerting.SEVERITY_CHOICES",
        "RecoveryActionEnum": "console.models.faults.RecoveryEpisode.Action",
    },
    # drf-spectacular's default enum hook, then the error responses every operation can give.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "console.api.schema.document_errors",
    ],
}

# Celery: JSON only, bounded time per task (cookiecutter-django, PostHog).
CELERY_BROKER_URL = env("CELERY_BROKER_URL", REDIS_URL, parse_url(("redis", "rediss", "amqp")))
CELERY_RESULT_BACKEND = env("CELERY_RESULT_BACKEND", REDIS_URL)
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_RESULT_EXPIRES = 3600
# Nothing reads a task's result (tasks are sent by name and report through the database and
# Redis keys of their own), so none is stored: an hour-long soak ended with 2,676 of its 2,762
# Redis keys being results nobody read. A task whose caller waits for its result would set
# ignore_result=False on itself.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = env("CELERY_TASK_TIME_LIMIT", 300, int)
CELERY_TASK_SOFT_TIME_LIMIT = env("CELERY_TASK_SOFT_TIME_LIMIT", 240, int)
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = TIME_ZONE

# Email: EMAIL_URL (smtp://user:pass@host:port, smtp+tls://..., console://, locmem://) or the
# plain Django SMTP settings.
EMAIL_URL = env(
    "EMAIL_URL", "console://", parse_url(("smtp", "smtp+tls", "smtp+ssl", "console", "locmem"))
)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", "backstop@localhost")
EMAIL_SUBJECT_PREFIX = env("EMAIL_SUBJECT_PREFIX", "[Backstop] ")
# Links in reports and alerts point here (no request exists when Celery beat sends them).
CONSOLE_BASE_URL = env("CONSOLE_BASE_URL", "http://127.0.0.1:8000")

SPARK_MASTER = env("SPARK_MASTER", "local[2]")
# Read by the stage processes (which inherit the agents' environment); checked here so that a
# wrong value stops the agents at start-up instead of every stage.
SPARK_LOG_LEVEL = env("SPARK_LOG_LEVEL", "WARN", spark_log_level)
# Stage checkpoints. With nodes on several hosts this must be shared storage (NFS, HDFS, S3A)
# so a stage can restart from its checkpoint on another node.
BACKSTOP_CHECKPOINT_ROOT = Path(env("BACKSTOP_CHECKPOINT_ROOT", str(VAR_DIR / "checkpoints")))
CONTROLLER_DISPATCH = env("CONTROLLER_DISPATCH", True, parse_bool)
# Reconcile threads of each controller process's fleet supervision (console/services/fleet.py);
# 0: this controller runs tasks only and supervises no job.
SUPERVISION_WORKERS = env("BACKSTOP_SUPERVISION_WORKERS", 4, int)
FAULT_RATE_LIMIT_PER_MINUTE = env("FAULT_RATE_LIMIT_PER_MINUTE", 6, int)
# Longest pause-node or stress-node a fault may ask for; node agents check it again.
FAULT_MAX_DURATION_S = env("FAULT_MAX_DURATION_S", 600.0, float)
# Bearer token Prometheus sends to /metrics; empty turns the endpoint off (404).
METRICS_TOKEN = env("METRICS_TOKEN", "")
# Retention (console/services/retention.py, purged hourly by the beat task purge_old_records).
METRIC_RETENTION_HOURS = env("METRIC_RETENTION_HOURS", 48, _positive_int)
DECISION_RETENTION_DAYS = env("DECISION_RETENTION_DAYS", 30, _positive_int)
# Closed episodes only (open ones are kept until measured); audits of purged ones are folded.
EPISODE_RETENTION_DAYS = env("EPISODE_RETENTION_DAYS", 30, _positive_int)
FAULT_RETENTION_DAYS = env("FAULT_RETENTION_DAYS", 30, _positive_int)
PROGRESS_RETENTION_HOURS = env("PROGRESS_RETENTION_HOURS", 48, _positive_int)
# The audit log (console.models.AuditEvent): who wrote what, kept a year by default.
AUDIT_RETENTION_DAYS = env("AUDIT_RETENTION_DAYS", 365, _positive_int)
# Rows per DELETE (each its own transaction), and how long one purge run may go on.
RETENTION_BATCH_ROWS = env("RETENTION_BATCH_ROWS", 10_000, _positive_int)
RETENTION_MAX_SECONDS = env("RETENTION_MAX_SECONDS", 300, _positive_int)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
}


def _email_settings(url: str) -> dict:
    """Translate EMAIL_URL into Django's EMAIL_* settings."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url)
    backends = {
        "console": "django.core.mail.backends.console.EmailBackend",
        "locmem": "django.core.mail.backends.locmem.EmailBackend",
    }
    if parsed.scheme in backends:
        return {"EMAIL_BACKEND": backends[parsed.scheme]}
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": parsed.hostname or "localhost",
        "EMAIL_PORT": parsed.port or (465 if parsed.scheme == "smtp+ssl" else 25),
        "EMAIL_HOST_USER": unquote(parsed.username or ""),
        "EMAIL_HOST_PASSWORD": unquote(parsed.password or ""),
        "EMAIL_USE_TLS": parsed.scheme == "smtp+tls",
        "EMAIL_USE_SSL": parsed.scheme == "smtp+ssl",
        "EMAIL_TIMEOUT": 10,
    }


globals().update(_email_settings(EMAIL_URL))
