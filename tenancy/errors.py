"""Refusals of tenancy requests, with messages a user can read."""

from __future__ import annotations


class TenancyError(ValueError):
    """A tenancy request that is refused, with a message for the user."""


class TenancyPermissionError(TenancyError):
    """The acting user may not make this change (a view answers 403)."""
