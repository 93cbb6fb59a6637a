"""The tick's fair-share inputs: every tenant's weight and decayed GPU-seconds held.

The usage is read from the parallelism history (:func:`jobs.usage.decayed_usage_by_tenant`,
one pass over the jobs active within ten half-lives).  With a half-life of days,
a minute changes it by well under a percent, so the tick reads it again only
every ``FAIR_SHARE_REFRESH_SECONDS`` and keeps it in this process meanwhile; a
restarted scheduler process reads it on its first tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from jobs.usage import decayed_usage_by_tenant
from scheduler.types import TenantShare


@dataclass(frozen=True)
class _Reading:
    at: datetime
    half_life_s: float
    usage: dict[str, float]


_last: _Reading | None = None


def tenant_usage(now: datetime) -> dict[str, float]:
    """Decayed GPU-seconds held per tenant slug, at most ``FAIR_SHARE_REFRESH_SECONDS`` old."""
    global _last
    half_life = float(settings.FAIR_SHARE_HALF_LIFE)
    reading = _last
    fresh = (
        reading is not None
        and reading.half_life_s == half_life
        and 0 <= (now - reading.at).total_seconds() < settings.FAIR_SHARE_REFRESH_SECONDS
    )
    if not fresh:
        reading = _Reading(now, half_life, decayed_usage_by_tenant(now, half_life))
        _last = reading
    assert reading is not None
    return reading.usage


def forget() -> None:
    """Drop the kept reading (tests; the next tick reads the history again)."""
    global _last
    _last = None


def tenant_shares(weights: Mapping[str, float], now: datetime) -> dict[str, TenantShare]:
    """The policy's fair-share view of the tenants that have jobs in the snapshot.

    Empty when fair share is off (``FAIR_SHARE=False``): the policy then orders
    tenants' jobs as it always did.
    """
    if not settings.FAIR_SHARE or not weights:
        return {}
    usage = tenant_usage(now)
    return {slug: TenantShare(weight, usage.get(slug, 0.0)) for slug, weight in weights.items()}
