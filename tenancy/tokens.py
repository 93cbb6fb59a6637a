"""API token secrets and the rules that decide whether a presented token is usable.

A pure core (no Django): the services and the authentication class call it.

::

    secret  = new_secret()            shown once, never stored
    key_hash = hash_secret(secret)    stored (sha256 hex), looked up on each request
    prefix  = display_prefix(secret)  stored, shown in lists so a user can tell tokens apart

A request's token is then refused (``refusal``) when it is revoked or expired,
and its ``last_used_at`` is written at most once a minute (``needs_touch``).

Lifetime policy (issue 35: a write token could mint 10-year tokens): a token lives at
most the strictest of the site's maximum (``API_TOKEN_MAX_DAYS``) and the maxima of its
user's tenants that set one (``Tenant.max_token_days``), as they are *now*: a lowered
maximum shortens the tokens already made (``effective_expiry``), it does not wait for
them to expire.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

PREFIX_LENGTH = 8
"""Characters of the secret kept in clear for display: too few to guess the rest."""
TOUCH_INTERVAL = timedelta(minutes=1)
"""``last_used_at`` is written at most this often, so a busy client costs no write a request."""
MAX_NAME_LENGTH = 64
MAX_EXPIRY_DAYS = 3650
"""The most ``API_TOKEN_MAX_DAYS`` may be set to: no token lives longer than ten years."""


def new_secret() -> str:
    """A fresh random token secret (40 URL-safe characters, 240 bits)."""
    return secrets.token_urlsafe(30)


def hash_secret(secret: str) -> str:
    """What is stored of a secret: its sha256, in hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def display_prefix(secret: str) -> str:
    """The short, non-secret start of a secret that lists show."""
    return secret[:PREFIX_LENGTH]


def expiry(now: datetime, days: int) -> datetime:
    """When a token made at ``now`` to last ``days`` days expires."""
    return now + timedelta(days=days)


def strictest_days(site_days: int, tenant_days: int | None) -> int:
    """The longest a token may live: the site's maximum, or a tenant's if that is shorter."""
    return site_days if tenant_days is None else min(site_days, tenant_days)


def effective_expiry(
    *, created_at: datetime, expires_at: datetime, max_days: int | None = None
) -> datetime:
    """When a token stops working: its own expiry, or ``max_days`` after it was made if
    that comes first (a maximum lowered after the token was made)."""
    if max_days is None:
        return expires_at
    return min(expires_at, created_at + timedelta(days=max_days))


def refusal(
    *,
    revoked_at: datetime | None,
    expires_at: datetime,
    now: datetime,
    created_at: datetime | None = None,
    max_days: int | None = None,
) -> str | None:
    """Why a token may not be used at ``now`` (a message for the client), or None if it may.

    With ``created_at`` and ``max_days`` the token also expires ``max_days`` after it was
    made, whatever its own ``expires_at`` says.
    """
    if revoked_at is not None:
        return f"token revoked on {revoked_at.date().isoformat()}"
    if created_at is not None:
        expires_at = effective_expiry(
            created_at=created_at, expires_at=expires_at, max_days=max_days
        )
    if expires_at <= now:
        return f"token expired on {expires_at.date().isoformat()}"
    return None


def needs_touch(last_used_at: datetime | None, now: datetime) -> bool:
    """Whether a use at ``now`` should be written down as the token's ``last_used_at``."""
    return last_used_at is None or now - last_used_at >= TOUCH_INTERVAL
