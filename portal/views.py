"""Tenant-facing pages: the dashboard and the API token page; error pages."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from jobs.live import tenant_snapshot
from jobs.models import Job
from portal.api.errors import json_not_found, json_server_error
from tenancy.models import Tenant
from tenancy.token_services import do_issue_token


def _selected_tenant(request: HttpRequest) -> Tenant | None:
    tenants = Tenant.objects.restrict(request.user)
    slug = request.GET.get("tenant")
    if slug:
        return tenants.filter(slug=slug).first()
    return tenants.first()


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The tenant dashboard: its jobs live (state, parallelism, progress, queue), quota, JCT."""
    tenant = _selected_tenant(request)
    snapshot = None
    if tenant is not None:
        snapshot = tenant_snapshot(tenant, Job.objects.restrict(request.user))
    return render(request, "dashboard.html", {"tenant": tenant, "snap": snapshot})


@login_required
@require_http_methods(["GET", "POST"])
def api_token(request: HttpRequest) -> HttpResponse:
    """Make the user a new API token and show its secret (stored hashed, so only now)."""
    token = do_issue_token(user=request.user) if request.method == "POST" else None
    return render(request, "token.html", {"token": token})


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404: JSON under /api/, a page elsewhere."""
    if request.path.startswith("/api/"):
        return json_not_found(request, exception)
    return render(request, "404.html", status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    """500: JSON under /api/, a page elsewhere."""
    if request.path.startswith("/api/"):
        return json_server_error(request)
    return render(request, "500.html", status=500)
