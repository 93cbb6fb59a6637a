"""Small helpers of the audit tests."""

from __future__ import annotations

from audit.models import AuditEntry


def only_row(action: str) -> AuditEntry:
    """The one audit row of ``action``; fails when there are none or several."""
    rows = list(AuditEntry.objects.filter(action=action))
    assert len(rows) == 1, f"{len(rows)} rows of {action}: {rows}"
    return rows[0]


def count(action: str) -> int:
    """How many audit rows of ``action`` there are."""
    return AuditEntry.objects.filter(action=action).count()
