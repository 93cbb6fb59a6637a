"""Django admin for code bundles: cluster admins see every tenant's uploads here, read-only.

Uploads go through ``bundles.services.do_upload`` (which writes the audit row);
there is no delete path, here or elsewhere: a job may still run the code.
"""

from django.contrib import admin

from bundles.models import CodeBundle
from utilities.admin import ReadOnlyAdminMixin


@admin.register(CodeBundle)
class CodeBundleAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
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
