"""Django admin for tenancy (cluster admins manage tenants, members and quotas here)."""

from django.contrib import admin

from tenancy.models import Membership, Tenant


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 1


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "slug",
        "name",
        "gpu_quota",
        "priority_weight",
        "profile_jobs",
        "artifact_retention_days",
        "log_retention_days",
    ]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]
