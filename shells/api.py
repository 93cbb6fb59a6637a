"""``/api/v1/shells/``: the shells of your tenants' jobs; an admin closes one.

Included by ``shells/urls.py``.  ``?open=1`` lists only open shells.  ``POST
/api/v1/shells/<id>/close/`` is for cluster admins (staff) alone; a tenant's member
gets 403, and another tenant's shell is a 404 to everyone but an admin.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from shells.models import Shell
from shells.serializers import ShellSerializer
from shells.services import do_request_close


class ShellViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet[Shell],
):
    """Shells opened into running jobs (``portalctl shell``), newest first."""

    serializer_class = ShellSerializer

    def get_queryset(self) -> QuerySet[Shell]:
        shells = Shell.objects.restrict(self.request.user).select_related(
            "tenant", "user", "closed_by"
        )
        if self.request.query_params.get("open") in ("1", "true"):
            shells = shells.filter(closed_at__isnull=True)
        return shells

    @extend_schema(
        parameters=[OpenApiParameter("open", bool, description="Only shells still open.")]
    )
    def list(self, request: Request) -> Response:
        """Shells of your tenants' jobs (every shell for an admin)."""
        return super().list(request)

    @extend_schema(request=None, responses={200: ShellSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsAdminUser])
    def close(self, request: Request, pk: str | None = None) -> Response:
        """Close an open shell now (admins): the agent ends it; it is recorded as closed by you."""
        shell = self.get_object()
        do_request_close(shell=shell, by=request.user, now=timezone.now())
        shell.refresh_from_db()
        return Response(ShellSerializer(shell).data)


router = SimpleRouter()
router.register("shells", ShellViewSet, basename="shell")
urlpatterns = router.urls
