"""Routes of jobs' API, mounted under ``/api/v1/`` (by ``jobs.urls``): jobs, arrays, their
statistics and usage, the tenants with their GPUs in use, the nodes' environments, sweeps, interactive sessions."""

from django.urls import path
from rest_framework.routers import SimpleRouter
from rest_framework.urlpatterns import format_suffix_patterns

from jobs.api.arrays import ArrayViewSet
from jobs.api.environments import EnvironmentCacheList, EnvironmentEvict, EvictionList
from jobs.api.sessions import SessionViewSet
from jobs.api.sweeps import SweepViewSet
from jobs.api.tenants import TenantViewSet
from jobs.api.usage import UsageView
from jobs.api.views import JctStatsView, JobViewSet

router = SimpleRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("tenants", TenantViewSet, basename="tenant")
router.register("arrays", ArrayViewSet, basename="array")
router.register("sweeps", SweepViewSet, basename="sweep")
router.register("sessions", SessionViewSet, basename="session")

urlpatterns = [
    path("stats/jct/", JctStatsView.as_view(), name="jct-stats"),
    path("usage/", UsageView.as_view(), name="api-usage"),
    path("environments/", EnvironmentCacheList.as_view(), name="environment-cache-list"),
    path("environments/evictions/", EvictionList.as_view(), name="environment-eviction-list"),
    path(
        "environments/<str:node>/<str:key>/evict/",
        EnvironmentEvict.as_view(),
        name="environment-evict-api",
    ),
    # The router's routes answer with a format suffix too (jobs.json), as they always have.
    *format_suffix_patterns(router.urls),
]
