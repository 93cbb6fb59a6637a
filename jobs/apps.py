"""The jobs app: training jobs, their lifecycle and history, the REST API."""

from django.apps import AppConfig


class JobsConfig(AppConfig):
    """App config for ``jobs``."""

    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"
