"""One JSON shape for every API error: ``{"message": ..., "errors": {field: [...]}}``."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import (
    ObjectDoesNotExist,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.db import DataError
from django.http import Http404
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler

from jobs.services import JobError
from tenancy.services import TenancyError


def _first_message(detail: Any) -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            inner = _first_message(value)
            return inner if key in ("detail", "non_field_errors") else f"{key}: {inner}"
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail)


def _as_field_errors(detail: Any) -> dict[str, Any]:
    if isinstance(detail, dict):
        return {str(k): v if isinstance(v, list) else [v] for k, v in detail.items()}
    if isinstance(detail, list):
        return {"non_field_errors": detail}
    return {}


def json_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler: domain errors become 4xx JSON, everything has a message."""
    if isinstance(exc, JobError):
        return Response({"message": exc.message, "errors": exc.errors}, status=exc.status)
    if isinstance(exc, TenancyError):
        return Response({"message": str(exc), "errors": {}}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ObjectDoesNotExist | Http404):
        # One message whatever the model: a 404 must not hint at what exists elsewhere.
        return Response({"message": "Not found.", "errors": {}}, status=404)
    if isinstance(exc, PermissionDenied):
        return Response({"message": "Permission denied.", "errors": {}}, status=403)
    if isinstance(exc, RequestDataTooBig):  # Django's own limits on a body it read
        return Response({"message": str(exc), "errors": {}}, status=413)
    if isinstance(exc, SuspiciousOperation):  # e.g. too many multipart fields or files
        return Response({"message": str(exc), "errors": {}}, status=400)
    if isinstance(exc, DataError):  # a last net: the edges should have refused the value
        message = "A value is out of range for the database, or holds a character it refuses."
        return Response({"message": message, "errors": {}}, status=400)
    response = exception_handler(exc, context)
    if response is None:
        return None
    detail = exc.detail if isinstance(exc, APIException) else response.data
    names_fields = isinstance(exc, ValidationError) or (
        isinstance(exc, ParseError) and isinstance(detail, dict)
    )
    errors = _as_field_errors(detail) if names_fields else {}
    response.data = {"message": _first_message(detail), "errors": errors}
    return response
