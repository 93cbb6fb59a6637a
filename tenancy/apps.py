"""The tenancy app: the bottom Django app; everything tenant-owned builds on it."""

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    """App config for ``tenancy``."""

    name = "tenancy"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the receivers that keep live sockets in step with access changes."""
        from tenancy import signals  # the receivers need the app registry: import when ready

        signals.connect()
