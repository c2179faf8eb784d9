"""Local development and the demo: debug on, everything embedded."""

from web.env import env, parse_bool
from web.settings import base, inherit

inherit(globals(), base)

DEBUG = env("DEBUG", True, parse_bool)
