"""Routes of the shells API, ``/api/v1/shells/`` (one include in portal.urls)."""

from django.urls import include, path

urlpatterns = [
    path("api/v1/", include("shells.api")),
]
