"""How the OpenAPI schema describes the API token (``Authorization: Token <secret>``).

drf-spectacular knows DRF's own authentication classes, not ours; without this every
operation's schema warns that it cannot resolve ``ApiTokenAuthentication``, and
``manage.py check --deploy`` reports those warnings.  Registered on import (``apps``).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension

from tenancy.authentication import KEYWORD


class ApiTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """The ``tokenAuth`` security scheme: a named API token in the Authorization header."""

    target_class = "tenancy.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        """An API key in the ``Authorization`` header, written ``Token <secret>``."""
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": f"`{KEYWORD} <secret>`: a token from the API token page",
        }
