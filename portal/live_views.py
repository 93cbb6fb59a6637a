"""JSON snapshots behind the live pages (a session or an API token, scoped with ``restrict``)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET

from jobs.live.snapshots import job_snapshot, tenant_snapshot
from jobs.models import Job
from tenancy.authentication import token_or_login_required
from tenancy.models import Tenant


@token_or_login_required
@require_GET
def tenant_jobs(request: HttpRequest, tenant_id: int) -> JsonResponse:
    """The dashboard's snapshot of one of the user's tenants."""
    tenant = get_object_or_404(Tenant.objects.restrict(request.user), pk=tenant_id)
    return JsonResponse(tenant_snapshot(tenant, Job.objects.restrict(request.user)))


@token_or_login_required
@require_GET
def job(request: HttpRequest, job_id: int) -> JsonResponse:
    """The job page's snapshot."""
    found = get_object_or_404(Job.objects.restrict(request.user), pk=job_id)
    return JsonResponse(job_snapshot(found))
