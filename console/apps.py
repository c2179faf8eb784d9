from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The Backstop console: models, API, admin and Dash pages."""

    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models.signals import post_migrate

        # Connects the audit log's receivers for logins, failed logins and logouts.
        from console import audit  # noqa: F401

        post_migrate.connect(_ensure_schedules, sender=self)


def _ensure_schedules(sender, **kwargs):
    """After migrations, make sure the controller's periodic tasks exist."""
    from console.services.schedules import ensure_periodic_tasks

    ensure_periodic_tasks()
