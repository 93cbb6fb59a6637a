"""Tenancy endpoints: who am I, which tenants can I see."""

from __future__ import annotations

from django.db.models import Q, QuerySet, Sum
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, viewsets
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.choices import ACTIVE_STATES
from portal.api.serializers import MeSerializer, TenantSerializer
from tenancy.models import Membership, Tenant


class MeView(APIView):
    """The authenticated user, with their tenants and roles."""

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        """Return the current user."""
        return Response(MeSerializer(request.user).data)


class TenantViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Tenant],
):
    """Tenants the user belongs to (every tenant for cluster admins)."""

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
