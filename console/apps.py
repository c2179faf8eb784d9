from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The Backstop console: models, API, admin and Dash pages."""

    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.db.models.signals import post_migrate

        # audit: connects the audit log's receivers for logins, failed logins and logouts;
        # checks: registers the system check of the Redis in use (`manage.py check`).
        from console import audit, checks  # noqa: F401

        post_migrate.connect(_ensure_schedules, sender=self)
        post_migrate.connect(_register_dash_apps, sender=self)


def _ensure_schedules(sender, **kwargs):
    """After migrations, make sure the controller's periodic tasks exist."""
    from console.services.schedules import ensure_periodic_tasks

    ensure_periodic_tasks()


def _register_dash_apps(sender, **kwargs):
    """After migrations, give every console Dash app its django-plotly-dash database row.

    django-plotly-dash creates the row on an app's first request, without a lock: concurrent
    first requests (a fresh install under load) raced on its unique name and one got a 500.
    """
    from django_plotly_dash.models import StatelessApp

    from console.dash.job.app import APP_NAME as JOB_APP
    from console.dash.overview.app import APP_NAME as OVERVIEW_APP
    from console.dash.placement.app import APP_NAME as PLACEMENT_APP
    from console.dash.recoveries.app import APP_NAME as RECOVERIES_APP
    from console.dash.resources.app import APP_NAME as RESOURCES_APP

    for name in (OVERVIEW_APP, JOB_APP, PLACEMENT_APP, RECOVERIES_APP, RESOURCES_APP):
        StatelessApp.objects.get_or_create(app_name=name)
