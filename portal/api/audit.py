"""``/api/v1/audit/``: the audit log, newest first (admins: all; tenant owners: their tenants).

Who sees what is ``tenancy.audit_access``'s and the filters ``audit.query``'s,
shared with the ``/audit/`` page and its CSV export.  Anybody else gets 403.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.exceptions import PermissionDenied, ValidationError

from audit.models import AuditEntry
from audit.query import AuditFilterForm, AuditFilters
from tenancy.audit_access import readable_audit


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


def _filter_parameters() -> list[OpenApiParameter]:
    form = AuditFilterForm()
    return [
        OpenApiParameter(name, OpenApiTypes.STR, description=str(field.help_text))
        for name, field in form.fields.items()
    ]


@extend_schema_view(list=extend_schema(parameters=_filter_parameters()))
class AuditViewSet(mixins.ListModelMixin, viewsets.GenericViewSet[AuditEntry]):
    """The audit log: every change a person or a token made, newest first, paginated."""

    serializer_class = AuditEntrySerializer

    def get_queryset(self) -> QuerySet[AuditEntry]:
        rows = readable_audit(self.request.user)
        if rows is None:
            raise PermissionDenied("Only cluster admins and tenant owners read the audit log.")
        form = AuditFilterForm(self.request.query_params)
        if not form.is_valid():
            errors: dict[str, Any] = {k: list(v) for k, v in form.errors.items()}
            raise ValidationError(errors)
        return AuditFilters.from_form(form).apply(rows)


urlpatterns = [path("audit/", AuditViewSet.as_view({"get": "list"}), name="audit-list")]
"""Included by ``portal.api.urls`` (one line there)."""
