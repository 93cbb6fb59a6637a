"""Routes of inventory's API, mounted under ``/api/v1/`` (by ``inventory.urls``)."""

from django.urls import path

from inventory.api.views import SuspectGpuList, SuspectGpuMark

urlpatterns = [
    path("gpus/suspect/", SuspectGpuList.as_view(), name="gpu-suspect-list"),
    path("gpus/<int:index>/suspect/", SuspectGpuMark.as_view(), name="gpu-suspect"),
]
