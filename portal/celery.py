"""The control plane's Celery application: the worker (tick, reports, what-if) and beat.

Configuration comes from Django settings (``CELERY_*``); control-plane tasks
use the ``portal`` queue, agents' reports the ``reports`` and ``heartbeats``
queues, from which a worker runs the report task only (``portal.broker``).  Node agents run their own app
(``workers.agent.celery_app``) on ``agent.<node>`` queues.
"""

from __future__ import annotations

import os

from celery import Celery

from portal.settings import DEFAULT_SETTINGS

os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)

app = Celery("portal", task_cls="portal.broker:PortalTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
