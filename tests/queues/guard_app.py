"""A Celery app for ``test_agent_queues``: the portal's broker transport and task base.

Built as ``portal.celery`` builds its app (``portal.broker``'s transport and
``PortalTask``), with two tasks that only note, in Redis, that they ran: one
under the report task's name, one under another name.  The queues agents may
push onto (``AGENT_REPORT_QUEUES``) come from the environment, so that the
test's queues are its own.
"""

from __future__ import annotations

import os

import redis
from celery import Celery

from portal.broker import TRANSPORT
from workers.protocol import REPORT_TASK

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings.test")

app = Celery(
    "guard",
    broker=os.environ["REDIS_URL"],
    set_as_current=False,
    task_cls="portal.broker:PortalTask",
)
app.conf.update(
    broker_transport=TRANSPORT,
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


def _note(key: str) -> None:
    redis.Redis.from_url(os.environ["REDIS_URL"]).set(key, "ran", ex=300)


@app.task(name=REPORT_TASK)  # type: ignore[untyped-decorator]
def report(key: str) -> None:
    """Stands for the report handler: notes that it ran."""
    _note(key)


@app.task(name="guard.other")  # type: ignore[untyped-decorator]
def other(key: str) -> None:
    """Stands for any other portal task (the tick, an export): notes that it ran."""
    _note(key)
