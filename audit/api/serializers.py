"""Serializers of the audit log's API."""

from __future__ import annotations

from rest_framework import serializers

from audit.models import AuditEntry


class AuditEntrySerializer(serializers.ModelSerializer[AuditEntry]):
    """One audit row: who, how, where from, which tenant, what, and the fields before/after."""

    tenant = serializers.CharField(source="tenant_slug", help_text="Tenant slug ('' if none).")
    before = serializers.JSONField(help_text="The changed fields before the change.")
    after = serializers.JSONField(help_text="The changed fields after the change.")

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "actor_id",
            "actor_name",
            "via",
            "client_address",
            "tenant_id",
            "tenant",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "before",
            "after",
        ]
        read_only_fields = fields
