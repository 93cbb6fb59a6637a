"""Routes of the inventory app: its REST API under ``/api/v1/`` (one include in portal.urls).

Its pages (the cluster, the topology) are still routed by the portal
(``portal.cluster_views``).
"""

from django.urls import include, path

urlpatterns = [path("api/v1/", include("inventory.api.urls"))]
