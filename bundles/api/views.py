"""The code API: upload an archive, list and inspect your tenants' bundles."""

from __future__ import annotations

from django.conf import settings
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from bundles.api.serializers import (
    CodeBundleDetailSerializer,
    CodeBundleSerializer,
    CodeUploadSerializer,
)
from bundles.errors import ARCHIVE_FIELD, BundlePermissionError, BundleRefusedError
from bundles.models import CodeBundle
from bundles.services import do_upload, resolve_tenant_for_upload

MULTIPART_SLACK = 64 * 1024  # room for the form's boundaries and other fields

_TENANT = OpenApiParameter("tenant", OpenApiTypes.STR, description="Tenant slug.")


def _as_api_error(exc: BundleRefusedError) -> Exception:
    """A refused upload as DRF reports it: 403 for a role, else 400 on the field."""
    if isinstance(exc, BundlePermissionError):
        return PermissionDenied(exc.message)
    return ValidationError({exc.field: [exc.message]})


@extend_schema_view(list=extend_schema(parameters=[_TENANT]))
class CodeBundleViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[CodeBundle],
):
    """Upload your training program as an archive; its sha256 is its id."""

    serializer_class = CodeBundleSerializer
    parser_classes = [MultiPartParser, FormParser]
    lookup_url_kwarg = "id"
    lookup_value_regex = "[0-9a-f]{64}"

    def get_queryset(self) -> QuerySet[CodeBundle]:
        bundles = CodeBundle.objects.restrict(self.request.user).select_related("tenant")
        if tenant := self.request.query_params.get("tenant"):
            bundles = bundles.filter(tenant__slug=tenant)
        return bundles

    def get_serializer_class(self) -> type[BaseSerializer[CodeBundle]]:
        return CodeBundleDetailSerializer if self.action == "retrieve" else CodeBundleSerializer

    def get_object(self) -> CodeBundle:
        """The bundle with this id among the caller's (``?tenant=`` picks one of several)."""
        bundle = self.get_queryset().filter(sha256=self.kwargs["id"]).order_by("tenant__slug")
        found = bundle.first()
        if found is None:
            raise NotFound
        return found

    @extend_schema(parameters=[_TENANT])
    def retrieve(self, request: Request, *args: object, **kwargs: object) -> Response:
        """One bundle, with the path and size of every file in it."""
        return Response(CodeBundleDetailSerializer(self.get_object()).data)

    @extend_schema(
        request={"multipart/form-data": CodeUploadSerializer},
        responses={201: CodeBundleSerializer, 200: CodeBundleSerializer},
    )
    def create(self, request: Request) -> Response:
        """Upload an archive: 201 with its id, or 200 if your tenant already has these bytes."""
        declared = str(request.META.get("CONTENT_LENGTH") or "0")
        length = int(declared) if declared.isdigit() else 0  # Django reads a bad one as 0 too
        if length > settings.CODE_MAX_BYTES + MULTIPART_SLACK:  # refused before it is read
            raise ValidationError(
                {
                    ARCHIVE_FIELD: [
                        f"The archive is over the limit of {settings.CODE_MAX_BYTES} bytes."
                    ]
                }
            )
        fields = CodeUploadSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        try:
            tenant = resolve_tenant_for_upload(request.user, fields.validated_data.get("tenant"))
            bundle, created = do_upload(
                user=request.user, tenant=tenant, uploaded_file=fields.validated_data["archive"]
            )
        except BundleRefusedError as exc:
            raise _as_api_error(exc) from exc
        return Response(
            CodeBundleSerializer(bundle).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )
