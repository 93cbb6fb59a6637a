"""The bundles app: the code archives tenants upload for their training programs."""

from django.apps import AppConfig


class BundlesConfig(AppConfig):
    """App config for ``bundles``."""

    name = "bundles"
    default_auto_field = "django.db.models.BigAutoField"
