"""Routes of inventory's API, mounted under ``/api/v1/`` (by ``inventory.urls``)."""

from django.urls import path

from inventory.api.views import (
    AcceptServer,
    ForgetPendingServer,
    PendingServerList,
    ServerList,
    ServerTypeView,
    SuspectGpuList,
    SuspectGpuMark,
)

urlpatterns = [
    path("servers/", ServerList.as_view(), name="server-list"),
    path("servers/pending/", PendingServerList.as_view(), name="server-pending-list"),
    path("servers/<int:pending>/accept/", AcceptServer.as_view(), name="server-accept"),
    path(
        "servers/pending/<int:pending>/forget/",
        ForgetPendingServer.as_view(),
        name="server-pending-forget",
    ),
    path("servers/<str:node>/type/", ServerTypeView.as_view(), name="server-type"),
    path("gpus/suspect/", SuspectGpuList.as_view(), name="gpu-suspect-list"),
    path("gpus/<int:index>/suspect/", SuspectGpuMark.as_view(), name="gpu-suspect"),
]
