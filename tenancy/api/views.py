"""``/api/v1/me/``: who the caller is, with their tenants and roles."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from tenancy.api.serializers import MeSerializer


class MeView(APIView):
    """The authenticated user, with their tenants and roles."""

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        """Return the current user."""
        return Response(MeSerializer(request.user).data)
