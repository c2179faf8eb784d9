"""WSGI entry point (gunicorn, uWSGI, or runserver)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings.local")
application = get_wsgi_application()
