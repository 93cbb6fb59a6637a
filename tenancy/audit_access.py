"""Who may read the audit log: shared by ``/api/v1/audit/``, ``/audit/`` and its CSV export.

    cluster admin (staff)  every row
    tenant owner           rows of the tenants they own (not rows without a tenant)
    anybody else           nothing: 403

The rule is tenancy's (who owns which tenant), so it lives here and not in
``audit``, which sits below ``tenancy``; the filters are ``audit.query``'s.
"""

from __future__ import annotations

from typing import Any

from audit.models import AuditEntry, AuditQuerySet
from tenancy.models import Membership, Role


def readable_audit(user: Any) -> AuditQuerySet | None:
    """The audit rows ``user`` may read, or None when they may read none (a 403)."""
    if user is None or not user.is_authenticated:
        return None
    rows: AuditQuerySet = AuditEntry.objects.all()
    if user.is_staff:
        return rows
    owned = list(
        Membership.objects.filter(user_id=user.pk, role=Role.OWNER).values_list(
            "tenant_id", flat=True
        )
    )
    return rows.for_tenants(owned) if owned else None


def may_read_audit(user: Any) -> bool:
    """Whether ``user`` sees the audit log at all (the navigation's link)."""
    if user is None or not user.is_authenticated:
        return False
    return bool(
        user.is_staff or Membership.objects.filter(user_id=user.pk, role=Role.OWNER).exists()
    )
