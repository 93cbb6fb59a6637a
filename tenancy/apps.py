"""The tenancy app: the bottom Django app; everything tenant-owned builds on it."""

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    """App config for ``tenancy``."""

    name = "tenancy"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the live-socket receivers; register the API token's OpenAPI scheme.

        Both need the app registry, so they are imported here, when it is ready.
        """
        from tenancy import signals
        from tenancy.api import schema  # noqa: F401  (a drf-spectacular extension)

        signals.connect()
