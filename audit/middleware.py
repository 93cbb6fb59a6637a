"""Make the request being served the audit log's actor for everything its view changes."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from audit.context import serving


class AuditContextMiddleware:
    """Sets ``audit.context`` for the request (after authentication, so the user is known)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        """Serve ``request`` with it as the audit context."""
        with serving(request):
            return self.get_response(request)
