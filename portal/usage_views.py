"""The Usage pages: GPU-hours a tenant's jobs held (its members), and every tenant's (admins).

Both draw ``jobs.usage.chart_data`` (the figures ``GET /api/v1/usage/`` answers)
and link its CSV for the same range.  The range is picked by day: ``since``
and ``until`` are UTC dates, both included.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from inventory.models import Gpu
from jobs.models import Job
from jobs.usage import MAX_RANGE, UsageRangeError, chart_data
from portal.cluster_views import admin_only
from tenancy.models import Tenant

DEFAULT_DAYS = 30


def page_range(since_raw: str | None, until_raw: str | None, *, today: date) -> tuple[date, date]:
    """The first and last UTC day shown: both included; default the last 30 days."""
    until = _day("until", until_raw) if until_raw else today
    since = _day("since", since_raw) if since_raw else until - timedelta(days=DEFAULT_DAYS - 1)
    if since > until:
        raise UsageRangeError("since", "The first day must not come after the last.")
    if (until - since).days + 1 > MAX_RANGE.days:
        raise UsageRangeError("until", f"At most {MAX_RANGE.days} days.")
    return since, until


def _day(field: str, raw: str) -> date:
    text = raw.strip()
    try:
        if len(text) == 10:
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise UsageRangeError(field, "Not a date (YYYY-MM-DD).")


def _render(
    request: HttpRequest, jobs: QuerySet[Job], *, tenant: Tenant | None, scope: str
) -> HttpResponse:
    now = timezone.now()
    context: dict[str, Any] = {"tenant": tenant, "scope": scope}
    try:
        first, last = page_range(
            request.GET.get("since"), request.GET.get("until"), today=now.astimezone(UTC).date()
        )
    except UsageRangeError as refused:
        context.update(error=f"{refused.field}: {refused.message}", since="", until="")
        return render(request, "usage.html", context, status=400)
    since = datetime.combine(first, time(), tzinfo=UTC)
    until = datetime.combine(last + timedelta(days=1), time(), tzinfo=UTC)
    data = chart_data(jobs, since=since, until=until, now=now, capacity_gpus=Gpu.objects.count())
    query = {"since": since.isoformat(), "until": until.isoformat(), "group_by": "job"}
    if tenant is not None:
        query["tenant"] = tenant.slug
    data["scope"] = scope
    data["tenant"] = tenant.slug if tenant else None
    context.update(
        data=data,
        since=first.isoformat(),
        until=last.isoformat(),
        csv_url=f"{reverse('api-usage')}?{urlencode({**query, 'format': 'csv'})}",
        json_url=f"{reverse('api-usage')}?{urlencode(query)}",
    )
    return render(request, "usage.html", context)


@login_required
@require_GET
def tenant_usage(request: HttpRequest) -> HttpResponse:
    """One of the user's tenants (``?tenant=SLUG``, else the first): per day, per user, share."""
    tenants = Tenant.objects.restrict(request.user)
    slug = request.GET.get("tenant")
    tenant = tenants.filter(slug=slug).first() if slug else tenants.first()
    if tenant is None:
        return render(request, "usage.html", {"tenant": None, "scope": "tenant"}, status=404)
    jobs = Job.objects.restrict(request.user).filter(tenant=tenant)
    return _render(request, jobs, tenant=tenant, scope="tenant")


@admin_only
@require_GET
def cluster_usage(request: HttpRequest) -> HttpResponse:
    """Every tenant's usage: per day and user, per user, and each tenant's share of the cluster."""
    return _render(request, Job.objects.all(), tenant=None, scope="cluster")
