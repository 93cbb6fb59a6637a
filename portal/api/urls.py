"""The API's root page (``/api/v1/``).

Every app routes its own API under ``/api/v1/`` (``tenancy.urls``,
``inventory.urls``, ``bundles.urls``, ``jobs.api.urls``, ``notifications.urls``: see
``portal.urls``); what is left here is the project's: the root page, which lists the
routers' resources as one ``DefaultRouter`` once did (and answers ``.json`` too).
"""

from django.urls import path
from rest_framework.routers import APIRootView
from rest_framework.urlpatterns import format_suffix_patterns

#: What the root page lists: each resource's name and the name of its list route.
ROOT_RESOURCES = {"jobs": "job-list", "tenants": "tenant-list", "tokens": "token-list"}

urlpatterns = [
    *format_suffix_patterns(
        [path("", APIRootView.as_view(api_root_dict=ROOT_RESOURCES), name="api-root")]
    ),
]
