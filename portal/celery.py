"""The Celery application shared by the control plane workers, beat and node agents.

Configuration comes from Django settings (``CELERY_*``).  Node agents consume
their own queue ``agent.<node>``; control-plane tasks use the ``portal`` queue.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.dev")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def agent_queue(node: str) -> str:
    """Name of the queue that the agent of ``node`` consumes."""
    return f"agent.{node}"
