"""App config of ``shells``."""

from django.apps import AppConfig


class ShellsConfig(AppConfig):
    """Interactive shells in running jobs' sandboxes: their records, API and WebSocket."""

    name = "shells"
    default_auto_field = "django.db.models.BigAutoField"
