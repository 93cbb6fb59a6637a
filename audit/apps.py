"""The audit app: the append-only record of every change a person or a token makes."""

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """App config for ``audit`` (below ``tenancy``: every service may record into it)."""

    name = "audit"
    default_auto_field = "django.db.models.BigAutoField"
