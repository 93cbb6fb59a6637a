"""Tenant-facing pages: the dashboard and the API token page; error pages."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from jobs.choices import ACTIVE_STATES, JobState
from jobs.models import Job
from jobs.services import tenant_jct_stats
from portal.api.errors import json_not_found, json_server_error
from portal.models import Tenant
from portal.services import do_issue_token


def _selected_tenant(request: HttpRequest) -> Tenant | None:
    tenants = Tenant.objects.restrict(request.user)
    slug = request.GET.get("tenant")
    if slug:
        return tenants.filter(slug=slug).first()
    return tenants.first()


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The tenant dashboard: its jobs, their states and parallelism, quota use, JCT."""
    tenant = _selected_tenant(request)
    jobs = Job.objects.none()
    in_use = 0
    stats = None
    if tenant is not None:
        jobs = Job.objects.restrict(request.user).filter(tenant=tenant).select_related("tenant")
        in_use = sum(jobs.filter(state__in=ACTIVE_STATES).values_list("parallelism", flat=True))
        stats = tenant_jct_stats(tenant)
    counts = dict.fromkeys(JobState.values, 0)
    for state in jobs.values_list("state", flat=True):
        counts[state] += 1
    return render(
        request,
        "dashboard.html",
        {
            "tenant": tenant,
            "jobs": jobs[:200],
            "in_use": in_use,
            "stats": stats,
            "counts": counts,
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def api_token(request: HttpRequest) -> HttpResponse:
    """Show the user's API token (created on first request)."""
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
