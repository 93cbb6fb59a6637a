"""API throttles: requests per user and per anonymous client address.

Django REST framework's throttles, with their rates read from ``API_THROTTLE_RATES``
when a request comes (not frozen when the class is imported), so that one setting
changes them everywhere.  A throttled request is a 429 with ``Retry-After``.
The counters live in the cache as lists of timestamps (JSON-able).
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import AnonRateThrottle, UserRateThrottle


class AnonAddressThrottle(AnonRateThrottle):
    """Requests of one client address that carry no valid credentials."""

    def get_rate(self) -> str | None:
        """The configured rate for anonymous clients."""
        rates: dict[str, str] = settings.API_THROTTLE_RATES
        return rates.get("anon")


class PerUserThrottle(UserRateThrottle):
    """Requests of one signed-in user, by session or API token alike."""

    def get_rate(self) -> str | None:
        """The configured rate for users."""
        rates: dict[str, str] = settings.API_THROTTLE_RATES
        return rates.get("user")
