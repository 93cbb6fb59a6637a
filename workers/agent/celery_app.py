"""The agent's own Celery application, configured from the environment.

A GPU server runs the agent without the portal's Django project: the broker
comes from ``CELERY_BROKER_URL`` (else ``REDIS_URL``).  The settings match
the control plane's app where the two meet on the wire: JSON only (a peer
that can write to the broker must not be able to make us unpickle),
late acknowledgement (a command redelivered after a crash is completed, see
``docs/agent.md``), one message prefetched at a time, and the same queue
names (``agent.<node>`` for commands, ``portal`` for reports).

A broker restart loses nothing of ours: the worker reconnects for as long as
it takes, and a report sent while the broker is away is published again
(``PUBLISH_RETRY_POLICY``, about a minute) before ``send_report`` gives up.

The app is built on first use, not at import, so importing the agent
connects to nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from celery import Celery

from workers.protocol import REPORTS_QUEUE


class BrokerNotConfigured(RuntimeError):
    """Neither ``CELERY_BROKER_URL`` nor ``REDIS_URL`` is set."""


def broker_url(environ: Mapping[str, str] | None = None) -> str:
    """The broker of the agent's Celery app: ``CELERY_BROKER_URL``, else ``REDIS_URL``."""
    env = os.environ if environ is None else environ
    url = env.get("CELERY_BROKER_URL") or env.get("REDIS_URL")
    if not url:
        raise BrokerNotConfigured("no broker: set CELERY_BROKER_URL or REDIS_URL")
    return url


PUBLISH_RETRY_POLICY: dict[str, float] = {
    "max_retries": 40,
    "interval_start": 0.0,
    "interval_step": 0.5,
    "interval_max": 2.0,
}
"""Kombu's retry of one publish: 0, 0.5, 1, 1.5, then every 2 s (about 75 s in all), which
outlasts a Redis restart (``workers.elastic.redis_client.DEFAULT_OUTAGE_S``)."""


def make_app(broker: str) -> Celery:
    """A Celery app for the agent protocol on ``broker``."""
    app = Celery("workers.agent", broker=broker, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_default_queue=REPORTS_QUEUE,
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,  # never give up on the broker: it comes back
        task_publish_retry=True,
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        task_ignore_result=True,
        worker_hijack_root_logger=True,
    )
    return app


_app: Celery | None = None
_app_lock = threading.Lock()


def agent_app() -> Celery:
    """The process's agent app (built from the environment on first use)."""
    global _app
    with _app_lock:
        if _app is None:
            _app = make_app(broker_url())
        return _app
