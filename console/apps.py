from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The Backstop console: models, API, admin and Dash pages."""

    name = "console"
    default_auto_field = "django.db.models.BigAutoField"
