"""The API's JSON parser: bodies within bounds, refused as JSON 400/413 errors otherwise.

DRF's own parser lets ``RecursionError`` (deep nesting) escape as a 500, turns
``1e400`` into ``inf`` and reads a body of any size. This one reads at most
``API_MAX_JSON_BYTES`` (413 past it) and parses with ``utilities.bounded_json``
(400 naming the top-level field under which the document nests too deeply).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

from utilities.bounded_json import JsonRefused, loads


class PayloadTooLarge(APIException):
    """A request body over the API's size limit (HTTP 413)."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def too_large(limit: int) -> PayloadTooLarge:
    """The 413 for a body over ``limit`` bytes."""
    return PayloadTooLarge(f"The request body is over the limit of {limit} bytes.")


def refused_body(exc: JsonRefused) -> ParseError:
    """A refused document as a 400: on its field when one is to blame, else on the body."""
    if exc.field is not None:
        return ParseError({exc.field: [exc.message]})
    return ParseError(f"Malformed JSON body: {exc.message}")


class BoundedJSONParser(JSONParser):
    """``application/json`` bodies: at most ``API_MAX_JSON_BYTES``, nested at most 32 deep."""

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        """The parsed document, or ``PayloadTooLarge`` / ``ParseError``."""
        limit: int = settings.API_MAX_JSON_BYTES
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise too_large(limit)  # refused before a byte is read
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise too_large(limit)
        try:
            return loads(raw)
        except JsonRefused as exc:
            raise refused_body(exc) from None
