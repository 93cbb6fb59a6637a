"""The portal app: tenancy, pages, API plumbing."""

from django.apps import AppConfig


class PortalConfig(AppConfig):
    """App config for ``portal``."""

    name = "portal"
    default_auto_field = "django.db.models.BigAutoField"
