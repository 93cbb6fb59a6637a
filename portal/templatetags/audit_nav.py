"""``{{ user|reads_audit }}``: whether the navigation shows the audit log's link."""

from __future__ import annotations

from typing import Any

from django import template

from tenancy.audit_access import may_read_audit

register = template.Library()


@register.filter
def reads_audit(user: Any) -> bool:
    """Cluster admins and tenant owners read the audit log (``tenancy.audit_access``)."""
    return may_read_audit(user)
