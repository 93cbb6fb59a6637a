"""``GET /api/v1/usage/``: GPU-seconds held by your tenants' jobs, as JSON or CSV.

::

    ?since=, ?until=   ISO 8601 date or time (a date is midnight UTC); default the
                       30 days up to now; at most 366 days
    ?group_by=         day (UTC), user (submitter), job or tenant (default day)
    ?tenant=SLUG       one of your tenants (an unknown or foreign slug is a 404)
    ?format=           json (default) or csv (a header row, then one row per group)

A tenant member sees the jobs of their own tenants; a cluster admin every tenant's.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import Job
from jobs.usage import GROUP_COLUMNS, UsageRangeError, check_range, usage_report
from tenancy.models import Tenant

FORMATS = ("json", "csv")


class CsvRenderer(BaseRenderer):
    """A usage report as CSV: the report's ``columns`` as a header row, then its rows."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        """Errors (no ``columns``) go out as their JSON object."""
        if not isinstance(data, dict) or "columns" not in data:
            return json.dumps(data).encode()
        return usage_csv(data).encode()


def usage_csv(report: Mapping[str, Any]) -> str:
    """The CSV text of a usage report (the same figures as its JSON rows)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(report["columns"])
    for row in report["rows"]:
        writer.writerow([_cell(row[column]) for column in report["columns"]])
    return out.getvalue()


def _cell(value: Any) -> str:
    text = str(value)
    # A cell a spreadsheet would run as a formula (a user or job name) is quoted as text.
    return "'" + text if text[:1] in ("=", "+", "-", "@") and not _is_number(text) else text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class UsageAmountSerializer(serializers.Serializer[Any]):
    """GPU-seconds and the same in GPU-hours."""

    gpu_seconds = serializers.FloatField()
    gpu_hours = serializers.FloatField()


class UsageRowSerializer(UsageAmountSerializer):
    """One group: its key columns (those of ``group_by``) and its GPU-seconds."""

    day = serializers.DateField(required=False, help_text="group_by=day: the UTC day.")
    user = serializers.CharField(required=False, help_text="group_by=user or job: the submitter.")
    tenant = serializers.CharField(required=False, help_text="group_by=tenant or job.")
    job = serializers.IntegerField(required=False, help_text="group_by=job: the job's id.")
    job_name = serializers.CharField(required=False, help_text="group_by=job.")


class UsageReportSerializer(serializers.Serializer[Any]):
    """GPU-seconds held in ``[since, until)``, in total and per group."""

    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    group_by = serializers.ChoiceField(choices=list(GROUP_COLUMNS))
    tenant = serializers.CharField(allow_null=True, help_text="The tenant asked for, if any.")
    columns = serializers.ListField(child=serializers.CharField(), help_text="The CSV header.")
    total = UsageAmountSerializer()
    rows = UsageRowSerializer(many=True)


def _param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    if value is not None and "\x00" in value:
        raise ValidationError({name: ["May not contain NUL characters."]})
    return value or None


class UsageView(APIView):
    """GPU-seconds held by the jobs of your tenants (every tenant's for admins)."""

    renderer_classes = [JSONRenderer, CsvRenderer]

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        """``format`` picks JSON or CSV; another value is a 400 (not DRF's 404)."""
        wanted = request.query_params.get("format")
        if not force and wanted is not None and wanted not in FORMATS:
            raise ValidationError({"format": [f"Must be one of {', '.join(FORMATS)}."]})
        return super().perform_content_negotiation(request, force)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since",
                OpenApiTypes.STR,
                description="Start (ISO 8601 date or time; a date is midnight UTC). "
                "Default: 30 days before until.",
            ),
            OpenApiParameter(
                "until",
                OpenApiTypes.STR,
                description="End, excluded (ISO 8601). Default: now. At most 366 days after since.",
            ),
            OpenApiParameter("group_by", OpenApiTypes.STR, enum=list(GROUP_COLUMNS), default="day"),
            OpenApiParameter(
                "tenant", OpenApiTypes.STR, description="Tenant slug (admins: any tenant)."
            ),
            OpenApiParameter("format", OpenApiTypes.STR, enum=list(FORMATS), default="json"),
        ],
        responses={
            (200, "application/json"): UsageReportSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
        },
    )
    def get(self, request: Request) -> Response:
        """GPU-seconds held (every second a job held n GPUs counts n), rolled up by group_by."""
        now = timezone.now()
        group_by = _param(request, "group_by") or "day"
        try:
            since, until = check_range(_param(request, "since"), _param(request, "until"), now=now)
            if group_by not in GROUP_COLUMNS:
                raise UsageRangeError("group_by", f"Must be one of {', '.join(GROUP_COLUMNS)}.")
        except UsageRangeError as refused:
            raise ValidationError({refused.field: [refused.message]}) from None
        jobs = Job.objects.restrict(request.user)
        slug = _param(request, "tenant")
        if slug:
            tenant = Tenant.objects.restrict(request.user).filter(slug=slug).first()
            if tenant is None:
                return Response({"message": "Not found.", "errors": {}}, status=404)
            jobs = jobs.filter(tenant=tenant)
        report = usage_report(jobs, since=since, until=until, now=now, group_by=group_by)
        response = Response({**report, "tenant": slug})
        if request.accepted_renderer.format == "csv":
            name = f"usage-{slug or 'all'}-{since:%Y%m%d}-{until:%Y%m%d}-{group_by}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response
