"""Django admin for code bundles: cluster admins see every tenant's uploads here, read-only.

Uploads go through ``bundles.services.do_upload`` (which writes the audit row);
there is no delete path, here or elsewhere: a job may still run the code.
"""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from bundles.models import CodeBundle


@admin.register(CodeBundle)
class CodeBundleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["sha256", "tenant", "kind", "size", "file_count", "uploaded_by", "created_at"]
    list_filter = ["tenant", "kind"]
    search_fields = ["sha256", "tenant__slug"]
    readonly_fields = [
        "tenant",
        "sha256",
        "kind",
        "size",
        "file_count",
        "files",
        "unpacked_bytes",
        "uploaded_by",
        "created_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Uploads go through the Code page and the API."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Read-only: a bundle's bytes and row never change."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """No delete path: it would bypass the audit log and orphan the stored archive."""
        return False
