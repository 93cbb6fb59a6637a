"""The control plane's Celery application: the worker (tick, reports, what-if) and beat.

Configuration comes from Django settings (``CELERY_*``); control-plane tasks
use the ``portal`` queue.  Node agents run their own app
(``workers.agent.celery_app``) on ``agent.<node>`` queues.
"""

from __future__ import annotations

import os

from celery import Celery

from portal.settings import DEFAULT_SETTINGS

os.environ.setdefault("DJANGO_SETTINGS_MODULE", DEFAULT_SETTINGS)

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
