"""``/api/v1/tenants/``: which tenants can I see, with their GPUs in use; admins create and
configure tenants.

A tenant is tenancy's, and so are this endpoint's serializers
(``tenancy.api.serializers``) and services; the viewset lives in ``jobs``
because each tenant's ``gpus_in_use`` sums its active jobs, and ``tenancy``
sits below ``jobs`` (it may not import ``jobs.choices``).
"""

from __future__ import annotations

from django.db.models import Q, QuerySet, Sum
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from jobs.choices import ACTIVE_STATES
from tenancy.api.serializers import (
    TenantCreateSerializer,
    TenantSerializer,
    TenantSettingsSerializer,
)
from tenancy.models import Membership, Tenant
from tenancy.services import do_create_tenant, do_update_tenant

ADMINS_ONLY = "only a cluster admin may create or configure tenants"


class TenantViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Tenant],
):
    """Tenants the user belongs to (every tenant for cluster admins); admins create and configure.

    A tenant the caller cannot see is a 404; a member who may see it but is not
    an admin gets a 403 on a change.
    """

    serializer_class = TenantSerializer
    lookup_field = "slug"

    def get_queryset(self) -> QuerySet[Tenant]:
        return (
            Tenant.objects.restrict(self.request.user)
            .annotate(
                gpus_in_use=Sum(
                    "jobs__parallelism", filter=Q(jobs__state__in=ACTIVE_STATES), default=0
                )
            )
            .order_by("slug")
        )

    def get_serializer_context(self) -> dict[str, object]:
        context = super().get_serializer_context()
        user = self.request.user
        context["roles"] = (
            dict(Membership.objects.filter(user=user).values_list("tenant_id", "role"))
            if user.is_authenticated
            else {}
        )
        return context

    def _answer(self, tenant: Tenant, status_code: int = status.HTTP_200_OK) -> Response:
        """The tenant as a list shows it (its GPUs in use included)."""
        fresh = self.get_queryset().get(pk=tenant.pk)
        return Response(self.get_serializer(fresh).data, status=status_code)

    @extend_schema(request=TenantCreateSerializer, responses={201: TenantSerializer})
    def create(self, request: Request) -> Response:
        """Create a tenant whose owner is an existing user (admins only)."""
        if not request.user.is_staff:
            raise PermissionDenied(ADMINS_ONLY)
        fields = TenantCreateSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        data = dict(fields.validated_data)
        created = do_create_tenant(
            slug=data.pop("slug"),
            owner_username=data.pop("owner"),
            create_owner=False,
            by=request.user,
            **data,
        )
        return self._answer(created.tenant, status.HTTP_201_CREATED)

    @extend_schema(request=TenantSettingsSerializer, responses=TenantSerializer)
    def partial_update(self, request: Request, slug: str) -> Response:
        """Change a tenant's quota, weight, cap, retention, defaults or ceilings (admins only)."""
        tenant = self.get_object()  # 404 before 403: an outsider learns nothing
        if not request.user.is_staff:
            raise PermissionDenied(ADMINS_ONLY)
        fields = TenantSettingsSerializer(data=request.data)
        fields.is_valid(raise_exception=True)
        return self._answer(do_update_tenant(tenant, by=request.user, **fields.validated_data))
