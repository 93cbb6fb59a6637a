"""WebSocket routes: one multiplexed live-update socket per page."""

from __future__ import annotations

from typing import Any

from django.urls import path, re_path

from portal.consumers import LiveConsumer
from portal.lab_consumers import LabConsumer
from shells.routing import websocket_urlpatterns as shell_routes

websocket_urlpatterns: list[Any] = [
    path("ws/live/", LiveConsumer.as_asgi()),
    *shell_routes,  # ws/jobs/<job>/shell/
    # A session's lab: the path JupyterLab opens with base_url /sessions/<id>/lab/.
    re_path(r"^sessions/(?P<job_id>[0-9]{1,18})/lab/", LabConsumer.as_asgi()),
]
