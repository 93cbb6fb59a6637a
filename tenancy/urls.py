"""Routes of the tenancy app: its REST API under ``/api/v1/`` (one include in portal.urls).

Its pages (members, tenants, the API token page) are still routed by the portal:
``portal.tenant_urls`` and ``portal.urls``.
"""

from django.urls import include, path

urlpatterns = [path("api/v1/", include("tenancy.api.urls"))]
