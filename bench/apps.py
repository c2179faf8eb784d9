from django.apps import AppConfig


class BenchConfig(AppConfig):
    """The benchmark harnesses: an app so that `manage.py bench` and `manage.py loadtest` are
    found. It has no models."""

    name = "bench"
    default_auto_field = "django.db.models.BigAutoField"
