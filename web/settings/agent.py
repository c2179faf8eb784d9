"""Node agents (docker/k8s/agents.yaml, docker/compose.yml): production, without the console's
secrets.

A node agent runs the stage processes, which run users' job code, as its children, in its own
container. It signs nothing, reads no database and sends no mail: its tasks take ids and talk to
Redis. So it is given none of SECRET_KEY, DATABASE_URL, EMAIL_URL or METRICS_TOKEN, and these
settings need none: a query would fail loudly (the dummy database), and the key is a random one
of this process (Django will not start without one). The stage processes get less still
(spark_runtime/stage_env.py).
"""

import secrets

from web.settings import base, inherit

inherit(globals(), base)

DEBUG = False
SECRET_KEY = secrets.token_urlsafe(50)
DATABASES = {"default": {"ENGINE": "django.db.backends.dummy"}}
