"""Login rate limiting: an address is slowed, then stopped; nobody can lock out an account.

    sign-in (login page, admin login) ─ refused? ─ yes ─> 429 on the login page (the admin's
                                           │ no            form shows its own error)
                                           ▼
                                     authenticate() ─ fails ─> count(address), count(account
                                           │                   from that address)
                                           │ succeeds ────────> forget (account, address)

The choice (issue 35: five failures from anywhere used to lock an account for everyone,
its owner included): failures are counted **per address** and **per (account, address)
pair**, never per account alone.

- **An address is slowed, then stopped.** After ``LOGIN_BACKOFF_AFTER_FAILURES`` failures
  in its window, each further attempt from that address waits 1 s, 2 s, 4 s, ... (at most
  ``LOGIN_BACKOFF_MAX_SECONDS``) after its last failure; after
  ``LOGIN_FAILURES_PER_ADDRESS`` failures it is refused until the window ends (many
  accounts tried from one place). A success does not clear an address's count: an
  attacker with an account of their own could otherwise reset it between guesses.
- **An account is limited from one address only.** After ``LOGIN_FAILURES_PER_ACCOUNT``
  failures for one account *from one address*, that address may not try that account
  until the window ends; every other address still may, so the owner signs in from
  their own address whatever anyone else typed. A success clears that pair's count.

Nothing counts per account across addresses, so guesses spread over many addresses are
slowed per address only: the password rules (``AUTH_PASSWORD_VALIDATORS``), single
sign-on and the audit log are the defence there, not a lockout an attacker could turn on
the owner. IPv6 addresses count per /64 (one subscriber's usual allocation), IPv4 per
address.

Each count lives in a fixed window that its first failure opens
(``LOGIN_FAILURE_WINDOW_SECONDS``): nothing is refused for longer than that. The cache
holds plain integers only (it may serialize as JSON), and keys carry a digest of the
username and address, never the text a client typed. Only sign-ins that come with a
request are counted (a browser or a client on the network); code that calls
``authenticate()`` itself is not. The address is ``REMOTE_ADDR``: behind a reverse proxy,
run the ASGI server so that it sets the client's address (``daphne --proxy-headers``),
or every client shares the proxy's address.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

KEY_PREFIX = "login-failures"
IPV6_PREFIX = 64


@dataclass(frozen=True)
class Limits:
    """Failures an (account, address) pair and an address may have in one window, and the
    address's backoff."""

    per_account: int  # failures for one account from one address
    per_address: int
    window_s: int
    backoff_after: int = 5
    backoff_max_s: int = 60

    @classmethod
    def from_settings(cls) -> Limits:
        """The limits configured in settings."""
        return cls(
            per_account=int(settings.LOGIN_FAILURES_PER_ACCOUNT),
            per_address=int(settings.LOGIN_FAILURES_PER_ADDRESS),
            window_s=int(settings.LOGIN_FAILURE_WINDOW_SECONDS),
            backoff_after=int(settings.LOGIN_BACKOFF_AFTER_FAILURES),
            backoff_max_s=int(settings.LOGIN_BACKOFF_MAX_SECONDS),
        )

    def backoff_s(self, failures: int) -> int:
        """Seconds an address with ``failures`` failures waits after its last one."""
        if failures < self.backoff_after:
            return 0
        steps = failures - self.backoff_after
        return int(min(2 ** min(steps, 30), self.backoff_max_s))


@dataclass(frozen=True)
class Refusal:
    """A sign-in that may not be tried now, and for how long (seconds) at most."""

    retry_after_s: int
    message: str


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def address_bucket(address: str) -> str:
    """What one client address counts as: itself (IPv4), its /64 (IPv6), or its text."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        return address or "unknown"  # a server that gave no address: all such share one
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/{IPV6_PREFIX}", strict=False))
    return str(parsed)


def _account(username: str) -> str:
    return username.strip().casefold()


def account_key(username: str, address: str) -> str:
    """The cache key counting failures for one account (any spelling) from one address."""
    return f"{KEY_PREFIX}:pair:{_digest(_account(username) + chr(0) + address_bucket(address))}"


def address_key(address: str) -> str:
    """The cache key counting failures from one client address."""
    return f"{KEY_PREFIX}:address:{_digest(address_bucket(address))}"


def _backoff_key(address: str) -> str:
    """When (epoch seconds) an address in backoff may try again."""
    return f"{KEY_PREFIX}:next:{_digest(address_bucket(address))}"


def client_address(request: HttpRequest | None) -> str:
    """The client's address as the server saw it ("" without a request or an address)."""
    if request is None:
        return ""
    return str(request.META.get("REMOTE_ADDR") or "")


def _minutes(seconds: int) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def refusal(
    username: str, address: str, limits: Limits | None = None, now: float | None = None
) -> Refusal | None:
    """Why a sign-in as ``username`` from ``address`` may not be tried now, or None."""
    limits = limits or Limits.from_settings()
    now = time.time() if now is None else now
    pair, from_address = account_key(username, address), address_key(address)
    backoff = _backoff_key(address)
    counts = cache.get_many([pair, from_address, backoff])
    if int(counts.get(from_address) or 0) >= limits.per_address:
        return Refusal(
            limits.window_s,
            "Too many failed sign-ins from this address. "
            f"Try again in {_minutes(limits.window_s)}.",
        )
    if int(counts.get(pair) or 0) >= limits.per_account:
        return Refusal(
            limits.window_s,
            "Too many failed sign-ins for this account from this address. "
            f"Try again in {_minutes(limits.window_s)}, or from another network.",
        )
    wait = int(counts.get(backoff) or 0) - int(now)
    if wait > 0:
        return Refusal(
            wait,
            "Too many failed sign-ins from this address. "
            f"Try again in {wait} second{'s' if wait != 1 else ''}.",
        )
    return None


def is_locked_out(username: str, address: str, limits: Limits | None = None) -> bool:
    """Whether a sign-in as ``username`` from ``address`` must be refused now."""
    return refusal(username, address, limits) is not None


def _count(key: str, window_s: int) -> int:
    cache.add(key, 0, timeout=window_s)  # opens the window; no-op while it is open
    try:
        return int(cache.incr(key))
    except ValueError:  # the window closed between the two calls: open a new one
        cache.set(key, 1, timeout=window_s)
        return 1


def record_failure(
    username: str, address: str, limits: Limits | None = None, now: float | None = None
) -> None:
    """Count one failed sign-in against the address and the (account, address) pair."""
    limits = limits or Limits.from_settings()
    now = time.time() if now is None else now
    _count(account_key(username, address), limits.window_s)
    failures = _count(address_key(address), limits.window_s)
    if wait := limits.backoff_s(failures):
        cache.set(_backoff_key(address), int(now) + wait, timeout=max(wait, 1))


def forget_pair(username: str, address: str) -> None:
    """A successful sign-in clears its (account, address) count; the address keeps its own."""
    cache.delete(account_key(username, address))


def lockout_message(limits: Limits | None = None) -> str:
    """What a refused client is told when no particular refusal is at hand."""
    limits = limits or Limits.from_settings()
    return f"Too many failed sign-ins from this address. Try again in {_minutes(limits.window_s)}."


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
        if request is not None and username is not None:
            refused = refusal(username, client_address(request))
            if refused is not None:
                raise PermissionDenied(refused.message)
        return super().authenticate(request, username=username, password=password, **kwargs)
