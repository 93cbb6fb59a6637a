"""Routes of jobs' API, mounted under ``/api/v1/`` (by ``portal.urls``): the nodes' environments."""

from django.urls import path

from jobs.api.environments import EnvironmentCacheList, EnvironmentEvict, EvictionList

urlpatterns = [
    path("environments/", EnvironmentCacheList.as_view(), name="environment-cache-list"),
    path("environments/evictions/", EvictionList.as_view(), name="environment-eviction-list"),
    path(
        "environments/<str:node>/<str:key>/evict/",
        EnvironmentEvict.as_view(),
        name="environment-evict-api",
    ),
]
