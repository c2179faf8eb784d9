"""Production: SECRET_KEY is required, debug off, secure cookies."""

from web.env import env, parse_bool
from web.settings import base, inherit

inherit(globals(), base)

SECRET_KEY = env("SECRET_KEY")
DEBUG = False
SESSION_COOKIE_SECURE = env("SESSION_COOKIE_SECURE", True, parse_bool)
CSRF_COOKIE_SECURE = env("CSRF_COOKIE_SECURE", True, parse_bool)
SECURE_CONTENT_TYPE_NOSNIFF = True
