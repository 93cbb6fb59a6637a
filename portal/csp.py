"""Content-Security-Policy on every response: scripts only from our own static files.

The policy is ``settings.CONTENT_SECURITY_POLICY`` (directive -> sources).  One source
is added per request: the live-update sockets' origin (``ws://host`` or ``wss://host``
for the host this request was addressed to), because older browsers do not count
WebSockets to the same host as ``'self'``.

A page breaks under this policy if it carries an inline ``<script>`` or an ``on*=``
handler; ``tests/portal/test_csp.py`` keeps templates free of both, and the browser
tests fail on any violation Chromium reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"


def render_policy(directives: Mapping[str, Sequence[str]], *, socket_origin: str = "") -> str:
    """The header value: ``directive source ...; ...``, with the socket origin in connect-src."""
    parts = []
    for directive, sources in directives.items():
        values = list(sources)
        if directive == "connect-src" and socket_origin:
            values.append(socket_origin)
        parts.append(" ".join([directive, *values]))
    return "; ".join(parts)


def socket_origin(request: HttpRequest) -> str:
    """``ws://host[:port]`` (``wss://`` over HTTPS) for the host the browser asked for.

    Empty for a host outside ``ALLOWED_HOSTS``: that request is answered 400 anyway, and
    only a validated host may be written into the header.
    """
    try:
        host = request.get_host()
    except DisallowedHost:
        return ""
    return f"{'wss' if request.is_secure() else 'ws'}://{host}"


class ContentSecurityPolicyMiddleware:
    """Adds the portal's policy to every response that does not set its own."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.directives: Mapping[str, Sequence[str]] = settings.CONTENT_SECURITY_POLICY

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if HEADER not in response:
            response[HEADER] = render_policy(self.directives, socket_origin=socket_origin(request))
        return response
