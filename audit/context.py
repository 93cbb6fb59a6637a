"""Who is acting: the request being served (set by ``audit.middleware``) or a named actor.

Services do not thread the request through their signatures: :func:`current_actor`
reads the request of the current context (its user, the API token that
authenticated it, the client address), or an actor a command set with
:func:`acting_as` (the CLI, the control plane).  Context variables follow both
threads and asyncio tasks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Any

from django.http import HttpRequest

SYSTEM = "system"


@dataclass(frozen=True)
class Actor:
    """Who made a change, and how they were authenticated."""

    user_id: int | None
    name: str
    via: str
    address: str | None = None


_request: ContextVar[HttpRequest | None] = ContextVar("audit_request", default=None)
_actor: ContextVar[Actor | None] = ContextVar("audit_actor", default=None)


@contextmanager
def serving(request: HttpRequest) -> Iterator[None]:
    """Within this block, changes are made on behalf of ``request``."""
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)


@contextmanager
def acting_as(actor: Actor) -> Iterator[None]:
    """Within this block, changes are made by ``actor`` (a command, the control plane)."""
    token = _actor.set(actor)
    try:
        yield
    finally:
        _actor.reset(token)


def system_actor(via: str) -> Actor:
    """The portal itself, acting for ``via`` (e.g. ``"control plane"``, ``"manage.py drain"``)."""
    return Actor(user_id=None, name=SYSTEM, via=via)


def _address(request: HttpRequest) -> str | None:
    """``REMOTE_ADDR`` when it is an IP address (see ``tenancy.login_limits`` on proxies)."""
    raw = str(request.META.get("REMOTE_ADDR") or "")
    try:
        return str(ip_address(raw))
    except ValueError:
        return None


def _via(request: HttpRequest) -> str:
    """How the request was authenticated: an API token names itself, else the session."""
    auth = getattr(request, "auth", None)  # DRF copies request.auth onto the Django request
    label = getattr(auth, "audit_label", None)
    if isinstance(label, str) and label:
        return label
    return "session"


def _user_fields(user: Any) -> tuple[int | None, str]:
    if user is None or not getattr(user, "is_authenticated", False):
        return None, "anonymous"
    return int(user.pk), str(user.get_username())


def current_actor(user: Any = None) -> Actor:
    """The actor of a change made now; ``user`` (the service's caller) wins over the request's.

    Order: an actor set by :func:`acting_as`; the request being served (its user, or
    ``user`` when the service names one); ``user`` alone ("direct": a shell or a test);
    else the portal itself.
    """
    explicit = _actor.get()
    if explicit is not None:
        if user is None:
            return explicit
        user_id, name = _user_fields(user)
        return Actor(user_id=user_id, name=name, via=explicit.via, address=explicit.address)
    request = _request.get()
    if request is not None:
        user_id, name = _user_fields(user if user is not None else getattr(request, "user", None))
        return Actor(user_id=user_id, name=name, via=_via(request), address=_address(request))
    if user is not None:
        user_id, name = _user_fields(user)
        return Actor(user_id=user_id, name=name, via="direct")
    return system_actor("direct")
