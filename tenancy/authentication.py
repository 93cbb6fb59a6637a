"""Token authentication: ``Authorization: Token <secret>`` for the API and the live data.

Three adapters over ``tenancy.token_services.do_use_token``:

* ``ApiTokenAuthentication`` — DRF's authentication class (every API view);
* ``TokenScopePermission`` — a DRF permission: a ``read`` token may use safe
  methods only, on every API endpoint;
* ``token_or_login_required`` — the same for plain Django views (the live
  JSON snapshots): a token in the header, else the browser session.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any

from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request

from tenancy.models import ApiToken, TokenScope
from tenancy.token_services import TokenRefused, do_use_token

if TYPE_CHECKING:  # rest_framework.views imports the authentication classes it is set to
    from rest_framework.views import APIView

KEYWORD = "Token"
BAD_HEADER = "invalid token header: use 'Authorization: Token <secret>'"
READ_ONLY = "this token is read-only"


def token_from_header(header: str) -> ApiToken | None:
    """The token an ``Authorization`` header presents; None if it presents none.

    Raises ``TokenRefused`` for a malformed ``Token`` header or a token that may not be used.
    """
    parts = header.split()
    if not parts or parts[0].lower() != KEYWORD.lower():
        return None
    if len(parts) != 2:
        raise TokenRefused(BAD_HEADER)
    return do_use_token(secret=parts[1])


class ApiTokenAuthentication(BaseAuthentication):
    """DRF authentication by a named API token; ``request.auth`` is the ``ApiToken``."""

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, ApiToken] | None:
        """The token's user and the token, None without a token header, 401 for a bad one."""
        header = request.META.get("HTTP_AUTHORIZATION", "")
        try:
            token = token_from_header(header)
        except TokenRefused as refused:
            raise AuthenticationFailed(str(refused)) from None
        if token is None:
            return None
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        """The ``WWW-Authenticate`` value: makes a refusal a 401, not a 403."""
        return KEYWORD


class TokenScopePermission(BasePermission):
    """A ``read`` token may only read: every unsafe method is 403 "this token is read-only"."""

    message = READ_ONLY

    def has_permission(self, request: Request, view: APIView) -> bool:
        """Sessions and write tokens pass; a read token passes for safe methods only."""
        token = request.auth
        if not isinstance(token, ApiToken) or token.scope != TokenScope.READ:
            return True
        return request.method in SAFE_METHODS


def token_or_login_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A Django view that a token header or a browser session may call.

    With a ``Token`` header the token decides (a bad one is a JSON 401 with the
    reason; a read token may only use safe methods); without one it is ``login_required``.
    """
    session_view = login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            token = token_from_header(request.META.get("HTTP_AUTHORIZATION", ""))
        except TokenRefused as refused:
            return JsonResponse(
                {"message": str(refused), "errors": {}},
                status=401,
                headers={"WWW-Authenticate": KEYWORD},
            )
        if token is None:
            return session_view(request, *args, **kwargs)
        if token.scope == TokenScope.READ and request.method not in SAFE_METHODS:
            return JsonResponse({"message": READ_ONLY, "errors": {}}, status=403)
        request.user = token.user
        return view(request, *args, **kwargs)

    return wrapper
