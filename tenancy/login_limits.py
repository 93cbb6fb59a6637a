"""Login rate limiting: failed sign-ins counted per account and per address, in the cache.

    sign-in (login page, admin login) ─ locked out? ─ yes ─> refused: 429 on the login page
                                            │ no
                                            ▼
                                      authenticate() ─ fails ─> count(account), count(address)
                                            │ succeeds ────────> forget the account's failures

Each key counts failures in a fixed window that the first failure opens
(``LOGIN_FAILURE_WINDOW_SECONDS``); an account is locked out after
``LOGIN_FAILURES_PER_ACCOUNT`` failures in its window, an address after
``LOGIN_FAILURES_PER_ADDRESS`` (many accounts tried from one place).  The lockout
ends with the window: nobody can lock an account for longer than that.

The cache holds plain integers only (it may serialize as JSON), and keys carry a
digest of the username, never the text a client typed.  Only sign-ins that come
with a request are counted (a browser or a client on the network); code that
calls ``authenticate()`` itself is not.  The address is ``REMOTE_ADDR``: behind a
reverse proxy, run the ASGI server so that it sets the client's address
(``daphne --proxy-headers``), or every client shares the proxy's address.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

KEY_PREFIX = "login-failures"


@dataclass(frozen=True)
class Limits:
    """How many failures an account and an address may have in one window."""

    per_account: int
    per_address: int
    window_s: int

    @classmethod
    def from_settings(cls) -> Limits:
        """The limits configured in settings."""
        return cls(
            per_account=int(settings.LOGIN_FAILURES_PER_ACCOUNT),
            per_address=int(settings.LOGIN_FAILURES_PER_ADDRESS),
            window_s=int(settings.LOGIN_FAILURE_WINDOW_SECONDS),
        )


def account_key(username: str) -> str:
    """The cache key counting failures for one account (any spelling of its name)."""
    digest = hashlib.sha256(username.strip().casefold().encode()).hexdigest()
    return f"{KEY_PREFIX}:account:{digest[:32]}"


def address_key(address: str) -> str:
    """The cache key counting failures from one client address."""
    digest = hashlib.sha256(address.encode()).hexdigest()
    return f"{KEY_PREFIX}:address:{digest[:32]}"


def client_address(request: HttpRequest | None) -> str:
    """The client's address as the server saw it ("" without a request)."""
    if request is None:
        return ""
    return str(request.META.get("REMOTE_ADDR") or "")


def is_locked_out(username: str, address: str, limits: Limits | None = None) -> bool:
    """Whether a sign-in as ``username`` from ``address`` must be refused now."""
    limits = limits or Limits.from_settings()
    keys = {account_key(username): limits.per_account}
    if address:
        keys[address_key(address)] = limits.per_address
    counts = cache.get_many(list(keys))
    return any(int(counts.get(key) or 0) >= limit for key, limit in keys.items())


def _count(key: str, window_s: int) -> None:
    cache.add(key, 0, timeout=window_s)  # opens the window; no-op while it is open
    try:
        cache.incr(key)
    except ValueError:  # the window closed between the two calls: open a new one
        cache.set(key, 1, timeout=window_s)


def record_failure(username: str, address: str, limits: Limits | None = None) -> None:
    """Count one failed sign-in against the account and the address."""
    limits = limits or Limits.from_settings()
    _count(account_key(username), limits.window_s)
    if address:
        _count(address_key(address), limits.window_s)


def forget_account(username: str) -> None:
    """A successful sign-in clears the account's count (the address keeps its count)."""
    cache.delete(account_key(username))


def lockout_message(limits: Limits | None = None) -> str:
    """What a locked-out client is told."""
    limits = limits or Limits.from_settings()
    minutes = max(1, round(limits.window_s / 60))
    return (
        "Too many failed sign-ins for this account or from this address. "
        f"Try again in {minutes} minute{'s' if minutes != 1 else ''}."
    )


class RateLimitedModelBackend(ModelBackend):
    """Django's username/password backend, refusing every sign-in while it is locked out.

    It replaces ``ModelBackend`` in ``AUTHENTICATION_BACKENDS`` (one backend, so
    sessions and ``login()`` work as before); ``PermissionDenied`` stops
    ``authenticate()`` at once, so the admin's login form is limited like the portal's.
    """

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Refuse when locked out; otherwise check the password as ``ModelBackend`` does."""
        if (
            request is not None
            and username is not None
            and is_locked_out(username, client_address(request))
        ):
            raise PermissionDenied(lockout_message())
        return super().authenticate(request, username=username, password=password, **kwargs)
