"""The shells' WebSocket route (included by ``portal.routing``)."""

from __future__ import annotations

from typing import Any

from django.urls import path

from shells.consumers import ShellConsumer

websocket_urlpatterns: list[Any] = [
    path("ws/jobs/<int:job_id>/shell/", ShellConsumer.as_asgi()),
]
