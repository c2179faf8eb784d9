"""Tests: fast password hashing, in-memory email, a Redis database of its own."""

import os

from spark_runtime.env import env, parse_url
from web.settings import base, inherit

inherit(globals(), base)

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# Db 15 keeps test keys away from a demo running on the same Redis.
REDIS_URL = env("TEST_REDIS_URL", "redis://127.0.0.1:6379/15", parse_url(("redis", "rediss")))
CELERY_BROKER_URL = REDIS_URL
CACHES = base.cache_settings(REDIS_URL)
# No collectstatic before the tests: pages link the files by their plain names (the live server
# serves them from the finders). tests/web/test_web_server.py collects and serves the hashed ones.
STORAGES = {
    **base.STORAGES,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
STATIC_ROOT = None  # nothing collected: WhiteNoise has nothing to serve, and says nothing
CELERY_RESULT_BACKEND = REDIS_URL
# Unit tests record jobs and faults without sending controller tasks; integration tests that run
# real workers turn it back on.
CONTROLLER_DISPATCH = False
# A file, not memory, so worker processes started by integration tests can open the test
# database (they are given its path); one per test run so parallel runs do not collide.
if base.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    _test_db = str(base.VAR_DIR / f"test-{os.getpid()}.sqlite3")
    DATABASES = {"default": {**base.DATABASES["default"], "TEST": {"NAME": _test_db}}}
