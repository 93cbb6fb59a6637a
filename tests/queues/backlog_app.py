"""A Celery app for ``test_heartbeat_queue``: the portal's worker settings, two kinds of task.

``report`` does real work for a while (hashing), as a progress or log report's
handler does; ``heartbeat`` notes when it ran. Queue names come from the
environment so that the test's queues are its own.
"""

from __future__ import annotations

import hashlib
import os
import time

import redis
from celery import Celery

app = Celery("backlog", broker=os.environ["REDIS_URL"], set_as_current=False)
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_acks_late=True,
    worker_prefetch_multiplier=1,  # as the portal's (CELERY_WORKER_PREFETCH_MULTIPLIER)
    broker_connection_retry_on_startup=True,
)
REPORT_WORK_S = 0.05


@app.task(name="backlog.report")
def report() -> None:
    """Hash for ``REPORT_WORK_S`` seconds: a report's handling time, as work, not sleep."""
    deadline = time.perf_counter() + REPORT_WORK_S
    digest = b"report"
    while time.perf_counter() < deadline:
        digest = hashlib.sha256(digest).digest()


@app.task(name="backlog.heartbeat")
def heartbeat(key: str) -> None:
    """Record, in Redis, when the heartbeat was handled (wall clock)."""
    redis.Redis.from_url(os.environ["REDIS_URL"]).set(key, repr(time.time()), ex=300)
