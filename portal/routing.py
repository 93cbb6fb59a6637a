"""WebSocket routes: one multiplexed live-update socket per page."""

from __future__ import annotations

from typing import Any

from django.urls import path

from portal.consumers import LiveConsumer
from shells.routing import websocket_urlpatterns as shell_routes

websocket_urlpatterns: list[Any] = [
    path("ws/live/", LiveConsumer.as_asgi()),
    *shell_routes,  # ws/jobs/<job>/shell/
]
