"""``/api/v1/audit/``: the audit log, newest first (admins: all; tenant owners: their tenants).

Who sees what is ``tenancy.audit_access``'s and the filters ``audit.query``'s,
shared with the ``/audit/`` page and its CSV export.  Anybody else gets 403.

The endpoint lives in ``tenancy`` rather than ``audit``: a tenant owner reads
their tenants' rows, and memberships are tenancy's, one ring above ``audit``
(which may not import it).  The row's shape is still audit's own
(``audit.api.serializers``).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, viewsets
from rest_framework.exceptions import PermissionDenied, ValidationError

from audit.api.serializers import AuditEntrySerializer
from audit.models import AuditEntry
from audit.query import AuditFilterForm, AuditFilters
from tenancy.audit_access import readable_audit


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
