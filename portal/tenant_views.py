"""Tenant pages: a tenant's members (its owners manage them), and the admins' tenant pages.

    /tenants/                              admins: every tenant, its limits and use
    /tenants/new/                          admins: create a tenant for an existing owner
    /tenants/<slug>/settings/              admins: quota, weight, caps, defaults, ceilings
    /tenants/<slug>/members/               members: who is in it; owners: invite
    /tenants/<slug>/members/<id>/role/     owners: change a role (POST)
    /tenants/<slug>/members/<id>/remove/   owners: confirm (GET), remove (POST)

A tenant the user cannot see is a 404 (as another tenant's job is); a member
who may see the list but not change it gets a 403.  Views parse, authorize and
call ``tenancy.services``; a refusal is shown on the page with a 400.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from jobs.choices import ACTIVE_STATES, JobState
from portal.cluster_views import admin_only
from tenancy.forms import (
    CREATE_FIELDS,
    InviteMemberForm,
    RoleForm,
    TenantCreateForm,
    TenantSettingsForm,
)
from tenancy.models import Membership, Role, Tenant
from tenancy.services import (
    TenancyError,
    can_manage_members,
    do_change_role,
    do_create_tenant,
    do_invite_member,
    do_remove_member,
    do_update_tenant,
)
from tenancy.tenant_settings import SETTINGS

WAITING_STATES = (JobState.PENDING, JobState.QUEUED)
ROLE_ORDER = {role: rank for rank, role in enumerate(Role.values)}  # owners first


def _visible_tenant(request: HttpRequest, slug: str) -> Tenant:
    """The tenant ``slug`` if the user may see it (a member or an admin), else 404."""
    return get_object_or_404(Tenant.objects.restrict(request.user), slug=slug)


def _managed_tenant(request: HttpRequest, slug: str) -> Tenant:
    """The tenant ``slug`` if the user may change its members: 404 unseen, 403 a non-owner."""
    tenant = _visible_tenant(request, slug)
    if not can_manage_members(request.user, tenant):
        raise PermissionDenied("only the tenant's owners may change its members")
    return tenant


def _member(tenant: Tenant, user_id: int) -> Membership:
    """The membership of user ``user_id`` in ``tenant`` (another tenant's member: 404)."""
    return get_object_or_404(
        Membership.objects.select_related("user"), tenant=tenant, user_id=user_id
    )


def _members_page(
    request: HttpRequest,
    tenant: Tenant,
    *,
    invite: InviteMemberForm | None = None,
    error: str | None = None,
) -> HttpResponse:
    memberships = sorted(
        Membership.objects.filter(tenant=tenant).select_related("user"),
        key=lambda m: (ROLE_ORDER.get(m.role, len(ROLE_ORDER)), m.user.get_username()),
    )
    manage = can_manage_members(request.user, tenant)
    context: dict[str, Any] = {
        "tenant": tenant,
        "memberships": memberships,
        "manage": manage,
        "roles": Role.choices,
        "invite": (invite or InviteMemberForm()) if manage else None,
        "error": error,
    }
    status = 400 if error or (invite is not None and invite.errors) else 200
    return render(request, "tenants/members.html", context, status=status)


@login_required
@require_GET
def members(request: HttpRequest, slug: str) -> HttpResponse:
    """Who is in the tenant, with roles and since when; owners also see the forms to change it."""
    return _members_page(request, _visible_tenant(request, slug))


@login_required
@require_POST
def invite_member(request: HttpRequest, slug: str) -> HttpResponse:
    """Add an existing user (by username or email) to the tenant with a role."""
    tenant = _managed_tenant(request, slug)
    form = InviteMemberForm(request.POST)
    if form.is_valid():
        try:
            added = do_invite_member(
                tenant=tenant,
                identifier=form.cleaned_data["identifier"],
                role=form.cleaned_data["role"],
                by=request.user,
            )
        except TenancyError as refused:
            form.add_error(None, str(refused))
        else:
            messages.success(request, f"Added {added.user} as {added.role}.")
            return redirect("tenant-members", slug=tenant.slug)
    return _members_page(request, tenant, invite=form)


@login_required
@require_POST
def change_role(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    """Give a member another role (the last owner keeps theirs)."""
    tenant = _managed_tenant(request, slug)
    membership = _member(tenant, user_id)
    form = RoleForm(request.POST)
    if not form.is_valid():
        return _members_page(request, tenant, error="Choose one of the roles.")
    try:
        do_change_role(
            tenant=tenant, user=membership.user, role=form.cleaned_data["role"], by=request.user
        )
    except TenancyError as refused:
        return _members_page(request, tenant, error=str(refused))
    messages.success(request, f"{membership.user} is now {form.cleaned_data['role']}.")
    return redirect("tenant-members", slug=tenant.slug)


@login_required
@require_http_methods(["GET", "POST"])
def remove_member(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    """Ask to confirm (GET), then take the member out of the tenant (POST)."""
    tenant = _managed_tenant(request, slug)
    membership = _member(tenant, user_id)
    context: dict[str, Any] = {"tenant": tenant, "membership": membership, "error": None}
    if request.method == "POST":
        try:
            do_remove_member(tenant=tenant, user=membership.user, by=request.user)
        except TenancyError as refused:
            context["error"] = str(refused)
        else:
            messages.success(request, f"Removed {membership.user} from {tenant.slug}.")
            if Tenant.objects.restrict(request.user).filter(pk=tenant.pk).exists():
                return redirect("tenant-members", slug=tenant.slug)
            return redirect("dashboard")  # they removed themselves
    status = 400 if context["error"] else 200
    return render(request, "tenants/remove.html", context, status=status)


@admin_only
@require_GET
def tenant_list(request: HttpRequest) -> HttpResponse:
    """Every tenant with its quota, weight, cap and what it uses now (three queries)."""
    tenants = Tenant.objects.annotate(
        gpus_in_use=Sum("jobs__parallelism", filter=Q(jobs__state__in=ACTIVE_STATES), default=0),
        running=Count("jobs", filter=Q(jobs__state__in=ACTIVE_STATES)),
        waiting=Count("jobs", filter=Q(jobs__state__in=WAITING_STATES)),
    ).order_by("slug")
    member_counts = dict(
        Membership.objects.values("tenant_id").annotate(n=Count("id")).values_list("tenant_id", "n")
    )
    rows = [(tenant, member_counts.get(tenant.pk, 0)) for tenant in tenants]
    return render(request, "tenants/list.html", {"rows": rows})


@admin_only
@require_http_methods(["GET", "POST"])
def tenant_new(request: HttpRequest) -> HttpResponse:
    """Create a tenant with an existing user as its owner."""
    form = TenantCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            created = do_create_tenant(
                slug=data["slug"],
                owner_username=data["owner"],
                create_owner=False,
                by=request.user,
                **{name: data[name] for name in CREATE_FIELDS if data[name] not in (None, "")},
            )
        except TenancyError as refused:
            form.add_error(None, str(refused))
        else:
            messages.success(request, f"Created tenant {created.tenant.slug}.")
            return redirect("tenants")
    return render(
        request,
        "tenants/form.html",
        {"form": form, "tenant": None},
        status=400 if form.errors else 200,
    )


@admin_only
@require_http_methods(["GET", "POST"])
def tenant_settings(request: HttpRequest, slug: str) -> HttpResponse:
    """Change a tenant's quota, weight, cap on waiting jobs, retention, defaults and ceilings."""
    tenant = get_object_or_404(Tenant, slug=slug)
    initial = {name: getattr(tenant, name) for name in SETTINGS}
    form = TenantSettingsForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            do_update_tenant(tenant, by=request.user, **form.cleaned_data)
        except TenancyError as refused:
            form.add_error(None, str(refused))
        else:
            messages.success(request, f"Saved the settings of {tenant.slug}.")
            return redirect("tenants")
    return render(
        request,
        "tenants/form.html",
        {"form": form, "tenant": tenant},
        status=400 if form.errors else 200,
    )
