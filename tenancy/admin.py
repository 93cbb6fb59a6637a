"""Django admin for tenancy (cluster admins manage tenants, members and quotas here)."""

from django.contrib import admin
from django.http import HttpRequest
from rest_framework.authtoken.models import TokenProxy

from tenancy.models import ApiToken, Membership, Tenant


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    model = Membership
    extra = 1


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = [
        "slug",
        "name",
        "gpu_quota",
        "max_queued_jobs",
        "priority_weight",
        "profile_jobs",
        "artifact_retention_days",
        "log_retention_days",
        "default_max_restarts",
        "max_restarts_ceiling",
        "default_max_runtime_s",
        "max_runtime_ceiling_s",
    ]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


# Tokens are ApiTokens now (hashed); authtoken's admin would make clear-text keys that no
# longer authenticate anybody.
if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Admins see and revoke tokens (set "revoked at"); secrets are never stored to show."""

    list_display = ["user", "name", "scope", "prefix", "created_at", "expires_at", "last_used_at"]
    list_filter = ["scope"]
    search_fields = ["user__username", "name", "prefix"]
    readonly_fields = ["user", "name", "scope", "prefix", "created_at", "last_used_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Tokens are made by their users (the token page, the API, ``issuetoken``)."""
        return False
