"""Django admin for code bundles (cluster admins see every tenant's uploads here)."""

from django.contrib import admin

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
