"""The portal app: the top of the house — pages, live read models, consumers, what-if."""

from django.apps import AppConfig


class PortalConfig(AppConfig):
    """App config for ``portal``."""

    name = "portal"
    default_auto_field = "django.db.models.BigAutoField"
