"""Why an upload was refused: one exception family, mapped to HTTP statuses by the API."""

from __future__ import annotations

ARCHIVE_FIELD = "archive"  # the form and API field that carries the uploaded file


class BundleRefusedError(Exception):
    """A refused upload; ``field`` is the request field the message belongs to."""

    status = 400

    def __init__(self, message: str, field: str = ARCHIVE_FIELD) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class BundlePermissionError(BundleRefusedError):
    """The user may read this tenant's bundles but not upload (HTTP 403)."""

    status = 403


class BundleTenantError(BundleRefusedError):
    """No tenant, or not a clear one, to upload to (HTTP 400 on ``tenant``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="tenant")
