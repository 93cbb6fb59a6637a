"""The tenancy app: the bottom Django app; everything tenant-owned builds on it."""

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    """App config for ``tenancy``."""

    name = "tenancy"
    default_auto_field = "django.db.models.BigAutoField"
