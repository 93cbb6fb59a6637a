"""OpenAPI: every operation documents the errors it can answer, in the portal's one error shape.

A drf-spectacular postprocessing hook (``SPECTACULAR_SETTINGS``). It adds the
``ApiError`` component (``{"message": ..., "errors": {field: [...]}}``, the
shape of ``portal.api.errors``) and, to each operation, the error statuses
that the operation can answer and does not document yet:

    every operation ............ 401 no credentials, 403 not allowed, 429 throttled
    with parameters or a body .. 400 bad input (``errors`` names the fields)
    with parameters ............ 404 no such object, page or tenant (or not yours)
    POST / PUT / PATCH / DELETE  409 the object's state forbids it
    with a request body ........ 413 body over the size limit
"""

from __future__ import annotations

from typing import Any

ERROR_COMPONENT = "ApiError"
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Every API error: a message, and the messages of each refused field.",
    "properties": {
        "message": {"type": "string", "description": "What went wrong, for a person."},
        "errors": {
            "type": "object",
            "description": "Field name (or non_field_errors) to its messages; empty when "
            "no field is to blame.",
            "additionalProperties": {"type": "array", "items": {}},
        },
    },
    "required": ["message", "errors"],
}

RENDERED_ERROR: dict[str, Any] = {
    "description": "The ApiError object, rendered in this media type (on a stream: an "
    "``event: error`` whose data is the object's JSON).",
}

ERROR_DESCRIPTIONS = {
    "400": "Bad input: a malformed body, a field or a parameter out of bounds.",
    "401": "No valid credentials (a missing, unknown, expired or revoked token).",
    "403": "Authenticated, but not allowed (a read-only role or token, or admins only).",
    "404": "No such object, page or tenant among yours.",
    "409": "The object's current state forbids the change (e.g. the job is over).",
    "413": "The request body is over the size limit.",
    "429": "Too many requests: throttled, retry after the Retry-After header's seconds.",
}

WRITE_METHODS = frozenset({"post", "put", "patch", "delete"})
HTTP_METHODS = frozenset({"get", "head", "options", *WRITE_METHODS})


def error_statuses(method: str, operation: dict[str, Any]) -> list[str]:
    """The error statuses an operation can answer (see the module's table)."""
    has_parameters = bool(operation.get("parameters"))
    has_body = "requestBody" in operation
    wanted = ["401", "403", "429"]
    if has_parameters or has_body:
        wanted.append("400")
    if has_parameters:
        wanted.append("404")
    if method in WRITE_METHODS:
        wanted.append("409")
    if has_body:
        wanted.append("413")
    return sorted(wanted)


def document_error_responses(
    result: dict[str, Any], generator: Any, request: Any, public: bool
) -> dict[str, Any]:
    """Postprocessing hook: add ``ApiError`` and each operation's missing error responses."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components[ERROR_COMPONENT] = ERROR_SCHEMA
    reference = {"$ref": f"#/components/schemas/{ERROR_COMPONENT}"}
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in HTTP_METHODS:
                continue
            responses = operation.setdefault("responses", {})
            content = {"application/json": {"schema": reference}}
            for media_type in _other_media_types(responses):
                content[media_type] = {"schema": RENDERED_ERROR}
            for code in error_statuses(method, operation):
                responses.setdefault(
                    code, {"description": ERROR_DESCRIPTIONS[code], "content": content}
                )
    return result


def _other_media_types(responses: dict[str, Any]) -> list[str]:
    """Non-JSON media types the operation answers in: an error goes out in the one the client
    asked for (an ``event: error`` on a stream, the JSON bytes for a download)."""
    types = {
        media_type
        for code, response in responses.items()
        if code.startswith("2")
        for media_type in (response or {}).get("content", {})
        if media_type != "application/json"
    }
    return sorted(types)
