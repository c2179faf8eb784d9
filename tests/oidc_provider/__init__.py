"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit's, in a tiny
Django project of its own (`site.py`) run as a separate process on the loopback address."""
