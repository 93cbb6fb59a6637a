"""Django admin for tenancy: every change it allows goes through the audited services.

Tenants: a save goes through ``do_update_tenant`` (one ``tenant.update`` audit row,
the same checks as the portal's settings page); adding and deleting are off here
(``/tenants/new/``; the portal has no delete).  Members are read-only here: they
are managed on ``/tenants/<slug>/members/`` and ``/api/v1/tenants/<slug>/members/``.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from rest_framework.authtoken.models import TokenProxy

from tenancy.errors import TenancyError
from tenancy.models import ApiToken, Membership, Tenant
from tenancy.services import do_update_tenant
from tenancy.tenant_settings import SETTINGS, UNSET_DEFAULTS, check_settings, fill_unset
from tenancy.token_services import do_revoke_any_token
from utilities.admin import ReadOnlyAdminMixin


class MembershipInline(admin.TabularInline):  # type: ignore[type-arg]
    """A tenant's members, shown read-only (changes: the members page or the API)."""

    model = Membership
    extra = 0
    fields = ["user", "role", "created_at"]
    readonly_fields = ["user", "role", "created_at"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Members are invited by an owner on the members page (audited)."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Roles change on the members page (audited)."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Members are removed on the members page (audited, last-owner rule)."""
        return False


class TenantAdminForm(forms.ModelForm):  # type: ignore[type-arg]
    """The model's own checks, then the services' (named in words, before the save)."""

    class Meta:
        model = Tenant
        fields = list(SETTINGS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in UNSET_DEFAULTS:
            self.fields[name].required = False

    def clean(self) -> dict[str, Any]:
        """Refuse what ``do_update_tenant`` would refuse, on the form."""
        cleaned: dict[str, Any] = super().clean() or {}
        fill_unset(cleaned)
        if self.instance.pk is not None and not self.errors:
            current = Tenant.objects.filter(pk=self.instance.pk).values(*SETTINGS).get()
            try:
                check_settings(current, {k: cleaned[k] for k in SETTINGS if k in cleaned})
            except TenancyError as refused:
                raise ValidationError(str(refused)) from None
        return cleaned


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Tenants; a save is ``do_update_tenant`` (audited)."""

    form = TenantAdminForm
    readonly_fields = ["slug", "created_at"]
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
        "max_token_days",
    ]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Tenants are created on ``/tenants/new/`` or with ``createtenant`` (audited)."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """No tenant is deleted from the admin: its jobs and audit trail would go with it."""
        return False

    def save_model(self, request: HttpRequest, obj: Tenant, form: Any, change: bool) -> None:
        """Save through ``do_update_tenant``: only the changed fields, one audit row."""
        fields = {name: form.cleaned_data[name] for name in form.changed_data if name in SETTINGS}
        do_update_tenant(Tenant.objects.get(pk=obj.pk), by=request.user, **fields)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        """Save no member: the inline is read-only (the admin's history reads these lists)."""
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []


# Tokens are ApiTokens now (hashed); authtoken's admin would make clear-text keys that no
# longer authenticate anybody.
if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Admins see tokens and revoke them with the "Revoke" action (through the audited
    service); no field is edited here, and secrets are never stored to show."""

    list_display = [
        "user",
        "name",
        "scope",
        "prefix",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["scope"]
    search_fields = ["user__username", "name", "prefix"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens", permissions=["view"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        """Revoke each selected token through ``do_revoke_any_token`` (one audit row each)."""
        for token_id in queryset.values_list("pk", flat=True):
            do_revoke_any_token(admin=request.user, token_id=token_id)  # type: ignore[arg-type]
