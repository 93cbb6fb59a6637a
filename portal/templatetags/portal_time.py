"""Time as every page writes it: one absolute format, humanised durations, relative times.

The template twin of ``PortalLive.when`` / ``seconds`` / ``ago`` in ``static/js/live.js``;
both write ``2026-12-01 13:48:42 UTC`` (24-hour, the portal's zone named), ``1 h 32 min``
and ``3 min ago``, so a page reads the same before and after a live update.

    {% load portal_time %}
    {{ job.finished_at|when }}   {{ job.jct_seconds|duration }}   {{ beat|ago }}
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import timezone

register = template.Library()

NONE = "—"


def _moment(value: Any) -> datetime | None:
    """A datetime from a datetime or an ISO string; None for anything else."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


@register.filter
def when(value: Any) -> str:
    """``2026-12-01 13:48:42 UTC``: a datetime or ISO time in the portal's zone, "—" for none."""
    moment = _moment(value)
    if moment is None:
        return NONE
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    local = timezone.localtime(moment)
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"


@register.filter
def duration(value: Any) -> str:
    """Seconds in words: ``45 s``, ``12 min``, ``1 h 32 min``, ``2 d 3 h``; "—" for none."""
    if value is None or value == "" or isinstance(value, bool):
        return NONE
    try:
        total = max(0, int(float(value) + 0.5))  # half up, as Math.round
    except (TypeError, ValueError, OverflowError):
        return NONE
    if total < 120:
        return f"{total} s"
    minutes = (total + 30) // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {rest} min" if rest else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@register.filter
def ago(value: Any, now: datetime | None = None) -> str:
    """How far from now: ``just now``, ``3 min ago``, ``in 1 h 5 min``; "—" for none."""
    moment = _moment(value)
    if moment is None:
        return NONE
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    delta = ((now or timezone.now()) - moment).total_seconds()
    if abs(delta) < 10:
        return "just now"
    return f"{duration(delta)} ago" if delta > 0 else f"in {duration(-delta)}"
