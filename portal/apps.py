"""The portal app: the top of the house — pages, live read models, consumers, what-if."""

from django.apps import AppConfig


class PortalConfig(AppConfig):
    """App config for ``portal``."""

    name = "portal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the portal's own deploy checks (``manage.py check --deploy``)."""
        from django.core import checks

        from portal.deploy_checks import labs_have_hosts_of_their_own

        checks.register(labs_have_hosts_of_their_own, checks.Tags.security, deploy=True)
