"""Routes of ``/api/v1/``."""

from django.urls import include, path
from rest_framework.routers import DefaultRouter

from jobs.api.usage import UsageView
from jobs.api.views import JctStatsView, JobViewSet
from portal.api import members
from portal.api.tokens import ApiTokenViewSet
from portal.api.views import MeView, TenantViewSet

router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("tenants", TenantViewSet, basename="tenant")
router.register("tokens", ApiTokenViewSet, basename="token")

urlpatterns = [
    path("me/", MeView.as_view(), name="me"),
    path("stats/jct/", JctStatsView.as_view(), name="jct-stats"),
    path("usage/", UsageView.as_view(), name="api-usage"),
    path("tenants/<slug:slug>/members/", members.members, name="tenant-member-list"),
    path("tenants/<slug:slug>/members/<int:user_id>/", members.member, name="tenant-member-detail"),
    path("", include("portal.api.audit")),  # audit/
    path("", include("notifications.api")),  # /api/v1/subscriptions/
    path("", include(router.urls)),
]
