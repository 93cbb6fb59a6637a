"""The inventory app: what the cluster is made of; jobs hold its GPUs."""

from django.apps import AppConfig


class InventoryConfig(AppConfig):
    """App config for ``inventory``."""

    name = "inventory"
    default_auto_field = "django.db.models.BigAutoField"
