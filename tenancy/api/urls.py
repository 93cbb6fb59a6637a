"""Routes of tenancy's API, mounted under ``/api/v1/`` (by ``tenancy.urls``)."""

from django.urls import path
from rest_framework.routers import SimpleRouter
from rest_framework.urlpatterns import format_suffix_patterns

from tenancy.api import members
from tenancy.api.audit import AuditViewSet
from tenancy.api.tokens import ApiTokenViewSet
from tenancy.api.views import MeView

router = SimpleRouter()
router.register("tokens", ApiTokenViewSet, basename="token")

urlpatterns = [
    path("me/", MeView.as_view(), name="me"),
    path("tenants/<slug:slug>/members/", members.members, name="tenant-member-list"),
    path("tenants/<slug:slug>/members/<int:user_id>/", members.member, name="tenant-member-detail"),
    path("audit/", AuditViewSet.as_view({"get": "list"}), name="audit-list"),
    # The router's routes answer with a format suffix too (tokens.json), as they always have.
    *format_suffix_patterns(router.urls),
]
