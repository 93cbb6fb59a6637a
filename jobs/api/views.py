"""The jobs REST API: thin viewsets that parse, authorize, call a service and serialize."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from django.db.models import QuerySet
from django.http import HttpResponseBase
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.api.downloads import ObjectMissing, download_response
from jobs.api.logs import EventStreamRenderer, check_log_query, follow_response, log_page
from jobs.api.serializers import (
    ArtifactSerializer,
    JobCancelSerializer,
    JobCreateSerializer,
    JobEventSerializer,
    JobLogSerializer,
    JobMetricsSerializer,
    JobSerializer,
    JobTenantSerializer,
    JobUpdateSerializer,
)
from jobs.artifacts import artifact_store
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import (
    check_job_spec,
    cluster_jct_stats,
    do_cancel_job,
    do_submit_job,
    do_update_job,
    tenant_jct_stats,
)
from jobs.session_services import check_not_session_launcher, check_session_update
from jobs.training_metrics import metric_series, progress_series
from tenancy.models import Tenant
from tenancy.services import resolve_tenant_for_write

MISSING_OBJECT = (
    "The artifact's stored object is missing from the artifact store "
    "(it was deleted, or the store is not the one it was written to)."
)


class OctetStreamRenderer(BaseRenderer):
    """Lets a client that asks for the bytes (``application/octet-stream``) in."""

    media_type = "application/octet-stream"
    format = "bin"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        """Errors go out as JSON even to such a client."""
        return json.dumps(data).encode()


def _since_step(params: Any) -> int | None:
    raw = params.get("since_step")
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({"since_step": ["Must be an integer."]}) from None
    if value < 0:
        raise ValidationError({"since_step": ["Must be 0 or more."]})
    return value


def object_body(request: Request, allowed: set[str]) -> dict[str, Any]:
    """The JSON body as a dict, refusing non-objects and unknown fields."""
    data = request.data
    if not isinstance(data, dict):
        raise ValidationError({"non_field_errors": ["Expected a JSON object."]})
    unknown = sorted(str(key) for key in data if key not in allowed)
    if unknown:
        raise ValidationError({"non_field_errors": [f"Unknown field(s): {', '.join(unknown)}."]})
    return dict(data)


def _plain_param(params: Any, name: str) -> str | None:
    """A query parameter as text; NUL (which PostgreSQL refuses in a query) is a 400."""
    value = params.get(name)
    if value is not None and "\x00" in value:
        raise ValidationError({name: ["May not contain NUL characters."]})
    return cast(str | None, value)


JobsQuery = TypeVar("JobsQuery", bound=QuerySet[Job])


def filter_state_and_tenant(jobs: JobsQuery, params: Any) -> JobsQuery:
    """``jobs`` narrowed by the list's ``state`` (comma-separated; an unknown one is a 400
    naming it) and ``tenant`` (a slug) query parameters, where given."""
    if states := _plain_param(params, "state"):
        wanted = [s.strip() for s in states.split(",") if s.strip()]
        unknown = sorted(set(wanted) - set(JobState.values))
        if unknown:
            raise ValidationError({"state": [f"Unknown state(s): {', '.join(unknown)}."]})
        jobs = jobs.filter(state__in=wanted)
    if tenant := _plain_param(params, "tenant"):
        jobs = jobs.filter(tenant__slug=tenant)
    return jobs


def submission(
    request: Request, shape: type[serializers.Serializer[Any]] = JobCreateSerializer
) -> tuple[str | None, dict[str, Any]]:
    """A submission's tenant slug (a slug, before it reaches a query) and the rest of its body
    (only the fields of ``shape``: a job's, or an array's)."""
    body = object_body(request, set(shape().fields))
    check_not_session_launcher(body)  # jobs, arrays and sweeps alike: sessions have their own
    tenant = JobTenantSerializer(data={"tenant": body.pop("tenant")} if "tenant" in body else {})
    tenant.is_valid(raise_exception=True)
    return tenant.validated_data.get("tenant"), body


@extend_schema_view(
    list=extend_schema(
        parameters=[
            OpenApiParameter("state", OpenApiTypes.STR, description="Comma-separated states."),
            OpenApiParameter("tenant", OpenApiTypes.STR, description="Tenant slug."),
            OpenApiParameter("workload", OpenApiTypes.STR),
            OpenApiParameter("array", OpenApiTypes.INT, description="Only this array's tasks."),
        ]
    )
)
class JobViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Job],
):
    """Submit, list, inspect, change and cancel training jobs of your tenants."""

    serializer_class = JobSerializer

    def get_queryset(self) -> QuerySet[Job]:
        jobs = (
            Job.objects.restrict(self.request.user)
            .select_related("tenant")
            .prefetch_related("dependencies")
        )
        if self.action != "list":
            return jobs
        params = self.request.query_params
        jobs = filter_state_and_tenant(jobs, params)
        if workload := _plain_param(params, "workload"):
            jobs = jobs.filter(workload=workload)
        if array := _plain_param(params, "array"):
            if not array.isdigit():
                raise ValidationError({"array": ["Must be an array id."]})
            jobs = jobs.filter(array_id=int(array))
        return jobs

    @extend_schema(request=JobCreateSerializer, responses={201: JobSerializer})
    def create(self, request: Request) -> Response:
        """Submit a job; it is queued and scheduled elastically within [min_gpus, max_gpus]."""
        slug, body = submission(request)
        tenant = resolve_tenant_for_write(request.user, slug)
        spec = check_job_spec(tenant=tenant, data=body)
        job = do_submit_job(user=request.user, tenant=tenant, spec=spec)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=JobUpdateSerializer, responses=JobSerializer)
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        """Change a job's priority, elastic range, restarts or run-time limit (also while it runs)."""
        job = self.get_object()
        body = object_body(request, set(JobUpdateSerializer().fields))
        fields = JobUpdateSerializer(data=body)
        fields.is_valid(raise_exception=True)
        check_session_update(job, fields.validated_data)
        job = do_update_job(user=request.user, job_id=job.pk, **fields.validated_data)
        return Response(JobSerializer(job).data)

    @extend_schema(request=JobCancelSerializer, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel the job: a graceful stop that releases its GPUs."""
        job = self.get_object()
        fields = JobCancelSerializer(data=object_body(request, {"reason"}))
        fields.is_valid(raise_exception=True)
        reason = fields.validated_data.get("reason") or ""
        job = do_cancel_job(user=request.user, job_id=job.pk, reason=reason)
        return Response(JobSerializer(job).data)

    @extend_schema(responses=JobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The job's history: every change of state or parallelism, with its reason."""
        job = self.get_object()
        page = self.paginate_queryset(cast(Any, job.events.all()))  # events, not jobs
        serializer = JobEventSerializer(page, many=True)
        return self.get_paginated_response(serializer.data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "tail", OpenApiTypes.INT, description="Lines (default 1000, max 10000)."
            ),
            OpenApiParameter("since", OpenApiTypes.STR, description="A cursor: lines after it."),
            OpenApiParameter("worker", OpenApiTypes.STR, description="Only this worker's lines."),
            OpenApiParameter(
                "follow",
                OpenApiTypes.BOOL,
                description="1: Server-Sent Events (text/event-stream), one data: line per log "
                "line, then event: end when the job is over.",
            ),
        ],
        responses={
            (200, "application/json"): JobLogSerializer,
            (200, "text/event-stream"): OpenApiTypes.STR,
        },
    )
    @action(detail=True, methods=["get"], renderer_classes=[JSONRenderer, EventStreamRenderer])
    def logs(self, request: Request, pk: str | None = None) -> HttpResponseBase:
        """The job's whole output as lines, tagged with worker, rank, generation and node."""
        job = self.get_object()
        query = check_log_query(request.query_params)
        if query.follow:
            return follow_response(job, query)
        return Response(log_page(job, query))

    @extend_schema(responses=ArtifactSerializer(many=True))
    @action(detail=True, methods=["get"])
    def artifacts(self, request: Request, pk: str | None = None) -> Response:
        """What the job stored: checkpoints (the final one too), its files and its log."""
        job = self.get_object()
        page = self.paginate_queryset(cast(Any, job.artifacts.order_by("-created_at", "-id")))
        serializer = ArtifactSerializer(page, many=True, context={"request": request})
        return self.get_paginated_response(serializer.data)

    @extend_schema(
        parameters=[
            OpenApiParameter("artifact_id", OpenApiTypes.INT, OpenApiParameter.PATH),
            OpenApiParameter(
                "Range",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description="One byte range: bytes=a-b, bytes=a- or bytes=-n.",
            ),
            OpenApiParameter(
                "If-None-Match",
                OpenApiTypes.STR,
                OpenApiParameter.HEADER,
                description='"<sha256>": 304 when it is this object.',
            ),
        ],
        responses={
            (200, "application/octet-stream"): OpenApiTypes.BINARY,
            (206, "application/octet-stream"): OpenApiTypes.BINARY,
            304: None,
            404: OpenApiTypes.OBJECT,
            416: None,
        },
    )
    @action(
        detail=True,
        methods=["get"],
        url_path=r"artifacts/(?P<artifact_id>[0-9]+)/download",
        renderer_classes=[JSONRenderer, OctetStreamRenderer],
    )
    def download(
        self, request: Request, pk: str | None = None, artifact_id: str | None = None
    ) -> HttpResponseBase:
        """The stored object's bytes, streamed (ETag = sha256, byte ranges)."""
        job = self.get_object()
        artifact = get_object_or_404(job.artifacts.all(), pk=artifact_id)
        try:
            return download_response(
                artifact_store(),
                artifact,
                range_header=request.headers.get("Range"),
                if_none_match=request.headers.get("If-None-Match"),
                if_range=request.headers.get("If-Range"),
            )
        except ObjectMissing:  # none, or a link the job planted: never followed
            return Response({"message": MISSING_OBJECT, "errors": {}}, status=404)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "since_step", OpenApiTypes.INT, description="Only what came after this step."
            )
        ],
        responses=JobMetricsSerializer,
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        """Progress (samples/s, GPUs, loss by step) and the metrics the program logged."""
        job = self.get_object()
        since = _since_step(request.query_params)
        return Response(
            {"progress": progress_series(job, since), "metrics": metric_series(job, since)}
        )


class JctStatsView(APIView):
    """Job completion time statistics for one of your tenants, or the whole cluster (admins)."""

    @extend_schema(
        parameters=[OpenApiParameter("tenant", OpenApiTypes.STR, description="Tenant slug.")],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request: Request) -> Response:
        """Return count, mean, median and p95 JCT in seconds."""
        slug = _plain_param(request.query_params, "tenant")
        if slug:
            tenant = Tenant.objects.restrict(request.user).filter(slug=slug).first()
            if tenant is None:
                return Response({"message": "Not found.", "errors": {}}, status=404)
            return Response({"scope": slug, **tenant_jct_stats(tenant).as_dict()})
        if not request.user.is_staff:
            return Response(
                {
                    "message": "Cluster-wide statistics are for admins; pass ?tenant=SLUG.",
                    "errors": {},
                },
                status=403,
            )
        return Response({"scope": "cluster", **cluster_jct_stats().as_dict()})
