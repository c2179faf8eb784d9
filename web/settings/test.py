"""Tests: fast password hashing, in-memory email, a Redis database of its own."""

from web.env import env, parse_url
from web.settings import base, inherit

inherit(globals(), base)

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# Db 15 keeps test keys away from a demo running on the same Redis.
REDIS_URL = env("TEST_REDIS_URL", "redis://127.0.0.1:6379/15", parse_url(("redis", "rediss")))
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
