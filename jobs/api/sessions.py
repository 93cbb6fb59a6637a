"""The sessions REST API (``/api/v1/sessions/``): start, list, inspect and stop interactive
sessions. Thin: parse, authorize, call ``jobs.session_services``, serialize. A session of
another tenant is a 404, as a missing one."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from bundles.models import CodeBundle
from jobs.api.serializers import JobCancelSerializer, JobTenantSerializer
from jobs.api.views import filter_state_and_tenant, object_body
from jobs.choices import JobKind, LabAccess
from jobs.models import Job
from jobs.session_cull import idle_deadline
from jobs.session_services import check_session_spec, do_start_session, do_stop_session
from tenancy.models import Tenant
from tenancy.services import resolve_tenant_for_write


def lab_url(job_id: int) -> str:
    """Where a session's JupyterLab opens: the portal's link (``portal.lab_origin.lab_open``)
    that signs the browser in to the lab's own host, or to the lab on the portal's origin
    when labs have no hosts of their own."""
    return f"/sessions/{job_id}/lab-open/"


class SessionCreateSerializer(serializers.Serializer[Any]):
    """What a client sends to start a session (documents the schema; the rules live in
    ``jobs.session_services``)."""

    tenant = serializers.SlugField(required=False, help_text="Your only writable one if left out.")
    name = serializers.CharField(max_length=100, required=False, default="session")
    gpus = serializers.IntegerField(min_value=1, required=False, default=1)
    priority = serializers.JSONField(
        required=False, help_text="0-100, or a class: 'high', 'normal' (default), 'low'."
    )
    idle_timeout_s = serializers.IntegerField(
        required=False,
        help_text="Seconds without activity before it is stopped (tenant's "
        "default if left out; at most the tenant's ceiling).",
    )
    max_lifetime_s = serializers.IntegerField(
        required=False,
        help_text="Seconds since its start before it is stopped (tenant's "
        "default if left out; at most the tenant's ceiling).",
    )
    lab_access = serializers.ChoiceField(choices=LabAccess.choices, required=False)
    code = serializers.CharField(
        required=False, help_text="A code bundle id of the tenant (optional: an empty home)."
    )
    environment = serializers.JSONField(
        required=False, help_text="Python packages the session needs, as for a job."
    )
    gpu_types = serializers.ListField(child=serializers.CharField(), required=False)
    node_selector = serializers.DictField(child=serializers.CharField(), required=False)
    cpus_per_gpu = serializers.IntegerField(min_value=0, required=False)
    mem_per_gpu_mib = serializers.IntegerField(min_value=0, required=False)


class SessionSerializer(serializers.ModelSerializer[Job]):
    """A session as the API returns it."""

    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    code: serializers.SlugRelatedField[CodeBundle] = serializers.SlugRelatedField(
        slug_field="sha256", read_only=True, allow_null=True
    )
    submitter = serializers.CharField(source="submitter.get_username", read_only=True)
    max_lifetime_s = serializers.IntegerField(source="max_runtime_s", read_only=True)
    lifetime_deadline = serializers.DateTimeField(
        source="runtime_deadline", read_only=True, allow_null=True
    )
    idle_deadline = serializers.SerializerMethodField()
    lab_url = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id",
            "tenant",
            "name",
            "submitter",
            "state",
            "gpus",
            "parallelism",
            "priority",
            "gpu_types",
            "node_selector",
            "cpus_per_gpu",
            "mem_per_gpu_mib",
            "code",
            "environment",
            "idle_timeout_s",
            "max_lifetime_s",
            "lab_access",
            "submitted_at",
            "started_at",
            "finished_at",
            "last_activity_at",
            "idle_deadline",
            "lifetime_deadline",
            "wait_reason",
            "queue_position",
            "estimated_start",
            "failure_reason",
            "lab_url",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_idle_deadline(self, job: Job) -> datetime | None:
        """When it is culled if nothing happens before (running sessions only)."""
        if job.state not in ("running", "scaling"):
            return None
        return idle_deadline(job.last_activity_at, job.started_at, job.idle_timeout_s)

    def get_lab_url(self, job: Job) -> str:
        """The portal path that opens its JupyterLab in a signed-in browser."""
        return lab_url(job.pk)


@extend_schema_view(
    list=extend_schema(
        summary="List your tenants' interactive sessions",
        parameters=[
            OpenApiParameter("state", OpenApiTypes.STR, description="Comma-separated states."),
            OpenApiParameter("tenant", OpenApiTypes.STR, description="Tenant slug."),
        ],
    ),
    retrieve=extend_schema(summary="Show one session: state, GPUs, idle and lifetime deadlines"),
)
class SessionViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Job],
):
    """Start, list, inspect and stop interactive sessions (JupyterLab on GPUs) of your
    tenants."""

    serializer_class = SessionSerializer

    def get_queryset(self) -> QuerySet[Job]:
        sessions = (
            Job.objects.restrict(self.request.user)
            .filter(kind=JobKind.SESSION)
            .select_related("tenant", "submitter", "code")
        )
        if self.action == "list":
            sessions = filter_state_and_tenant(sessions, self.request.query_params)
        return sessions

    @extend_schema(
        summary="Start an interactive session (JupyterLab on GPUs)",
        request=SessionCreateSerializer,
        responses={201: SessionSerializer},
    )
    def create(self, request: Request) -> Response:
        """Start a session: a fixed-size job that runs JupyterLab, queued and placed like any
        job; stopped when idle for its idle timeout or at its lifetime."""
        body = object_body(request, set(SessionCreateSerializer().fields))
        slug_field = JobTenantSerializer(
            data={"tenant": body.pop("tenant")} if "tenant" in body else {}
        )
        slug_field.is_valid(raise_exception=True)
        tenant = resolve_tenant_for_write(request.user, slug_field.validated_data.get("tenant"))
        spec = check_session_spec(tenant=tenant, data=body)
        job = do_start_session(user=request.user, tenant=tenant, spec=spec)
        return Response(SessionSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Stop a session (its home is saved)",
        request=JobCancelSerializer,
        responses=SessionSerializer,
    )
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """Stop the session: its home is saved, its GPUs released."""
        job = self.get_object()
        fields = JobCancelSerializer(data=object_body(request, {"reason"}))
        fields.is_valid(raise_exception=True)
        reason = fields.validated_data.get("reason") or ""
        job = do_stop_session(user=request.user, job_id=job.pk, reason=reason)
        return Response(SessionSerializer(job).data)
