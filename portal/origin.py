"""Which page origins may open the live WebSocket: the portal's own, port included.

Channels' ``AllowedHostsOriginValidator`` compares only the origin's host with
``ALLOWED_HOSTS``, so a page served from another port of the same host (any other
web server there) could open an authenticated socket with the user's cookie.
Here an origin is accepted when it is the socket's own origin, host *and* port
(the ``Host`` header, which must be an allowed host), or one of
``CSRF_TRUSTED_ORIGINS`` (the same list Django's CSRF check trusts)::

    Origin http://portal:8000   Host portal:8000   ─> accepted (same origin)
    Origin http://portal:9000   Host portal:8000   ─> refused  (another port)
    Origin https://portal       Host portal        ─> accepted (443 = the origin's default)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain

DEFAULT_PORTS = {"http": 80, "https": 443}


class Origin(NamedTuple):
    """A browser origin, its port made explicit."""

    scheme: str
    host: str
    port: int


def parse_origin(value: str) -> Origin | None:
    """``scheme://host[:port]`` as an ``Origin``; None for anything else (``null`` included)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname or parts.path not in ("", "/"):
        return None
    return Origin(scheme, parts.hostname.lower(), port or DEFAULT_PORTS[scheme])


def _trusted(origin: Origin, pattern: str) -> bool:
    trusted = parse_origin(pattern.replace("://*.", "://wildcard."))
    if trusted is None or (trusted.scheme, trusted.port) != (origin.scheme, origin.port):
        return False
    if "://*." in pattern:
        return is_same_domain(origin.host, "." + trusted.host.removeprefix("wildcard."))
    return origin.host == trusted.host


def origin_allowed(
    origin: str | None,
    host: str | None,
    allowed_hosts: Sequence[str],
    trusted_origins: Sequence[str] = (),
) -> bool:
    """Whether a socket from page ``origin`` to ``host`` (the Host header) may open."""
    parsed = parse_origin(origin) if origin else None
    if parsed is None:
        return False
    if any(_trusted(parsed, pattern) for pattern in trusted_origins):
        return True
    if not host:
        return False
    domain, port = split_domain_port(host.lower())
    if not domain or not validate_host(domain, list(allowed_hosts)):
        return False
    if port and not port.isdigit():
        return False
    host_port = int(port) if port else DEFAULT_PORTS[parsed.scheme]
    return (parsed.host.strip("[]"), parsed.port) == (domain.strip("[]"), host_port)


class SameOriginValidator:
    """ASGI middleware: refuse a WebSocket whose ``Origin`` is not the portal's own."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        """Pass the connection on, or deny it before the handshake."""
        if scope["type"] == "websocket":
            headers = {k.lower(): v for k, v in scope.get("headers", [])}
            origin = headers.get(b"origin", b"").decode("latin1") or None
            host = headers.get(b"host", b"").decode("latin1") or None
            if not origin_allowed(
                origin, host, settings.ALLOWED_HOSTS, settings.CSRF_TRUSTED_ORIGINS
            ):
                return await WebsocketDenier.as_asgi()(scope, receive, send)
        return await self.application(scope, receive, send)
