"""When a report's event happened, as the control plane records it."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone

from workers.protocol import Report


def report_time(report: Report) -> datetime:
    """The report's own time, never later than now (an agent's clock may run ahead)."""
    return min(datetime.fromtimestamp(report.at, tz=UTC), timezone.now())
