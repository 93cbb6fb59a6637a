"""Why a job request was refused: one exception family, mapped to HTTP statuses by the API."""

from __future__ import annotations

from collections.abc import Mapping


class JobError(Exception):
    """A refused job request; ``errors`` maps field names to messages."""

    status = 400

    def __init__(self, message: str, errors: Mapping[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errors: dict[str, list[str]] = dict(errors or {})


class JobValidationError(JobError):
    """The request's fields are invalid (HTTP 400)."""


class JobPermissionError(JobError):
    """The user may read but not change this job (HTTP 403)."""

    status = 403


class JobConflictError(JobError):
    """The request makes no sense in the job's current state (HTTP 409)."""

    status = 409
