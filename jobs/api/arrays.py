"""The job arrays REST API (``/api/v1/arrays/``): thin, like the jobs' — parse, authorize,
call ``jobs.arrays``, serialize.  An array of another tenant is a 404, as a missing one."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.api.serializers import (
    ArrayCreateSerializer,
    ArrayDetailSerializer,
    ArraySerializer,
    JobCancelSerializer,
)
from jobs.api.views import object_body, submission
from jobs.arrays import (
    array_counts,
    array_tasks,
    check_array_spec,
    do_cancel_array,
    do_retry_array,
    do_submit_array,
)
from jobs.models import JobArray
from tenancy.services import resolve_tenant_for_write


def _detail(array: JobArray) -> dict[str, Any]:
    context = {"counts": array_counts([array]), "tasks": array_tasks(array)}
    return dict(ArrayDetailSerializer(array, context=context).data)


class ArrayViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[JobArray],
):
    """Submit, list and inspect job arrays of your tenants; cancel them, retry failed tasks."""

    serializer_class = ArraySerializer

    def get_queryset(self) -> QuerySet[JobArray]:
        return JobArray.objects.restrict(self.request.user).select_related("tenant")

    def get_serializer_context(self) -> dict[str, Any]:
        """The page's counts per state, read in one query (no query per array)."""
        context = super().get_serializer_context()
        page = getattr(self, "page", None)
        if page is not None:
            context["counts"] = array_counts(page)
        return context

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The arrays of your tenants, newest first, with their counts per state."""
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        self.page = page
        serializer = self.get_serializer(page, many=True)
        return self.get_paginated_response(serializer.data)

    @extend_schema(responses=ArrayDetailSerializer)
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """One array: counts per state and each task's latest attempt."""
        return Response(_detail(self.get_object()))

    @extend_schema(request=ArrayCreateSerializer, responses={201: ArrayDetailSerializer})
    def create(self, request: Request) -> Response:
        """Submit an array: ``size`` tasks of one program, each with TASK_ID and TASK_COUNT in
        its environment, at most ``max_running`` queued or running at once."""
        slug, body = submission(request, ArrayCreateSerializer)
        tenant = resolve_tenant_for_write(request.user, slug)
        spec = check_array_spec(tenant=tenant, data=body)
        array = do_submit_array(user=request.user, tenant=tenant, spec=spec)
        return Response(_detail(array), status=status.HTTP_201_CREATED)

    @extend_schema(request=JobCancelSerializer, responses=ArrayDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel every task that has not ended (the waiting ones first)."""
        array = self.get_object()
        fields = JobCancelSerializer(data=object_body(request, {"reason"}))
        fields.is_valid(raise_exception=True)
        reason = fields.validated_data.get("reason") or ""
        array = do_cancel_array(user=request.user, array_id=array.pk, reason=reason)
        return Response(_detail(array))

    @extend_schema(request=None, responses=ArrayDetailSerializer)
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        """Submit again each task whose latest attempt failed (same TASK_ID)."""
        array = self.get_object()
        object_body(request, set())
        do_retry_array(user=request.user, array_id=array.pk)
        return Response(_detail(array))
