"""Routes of the bundles app: the Code page and ``/api/v1/code/`` (one include in portal.urls)."""

from django.urls import include, path

from bundles import views

urlpatterns = [
    path("code/", views.code_page, name="code"),
    path("api/v1/", include("bundles.api.urls")),
]
