"""Celery tasks of the notifications app: thin wrappers over the services.

Fan-out and the sweep run on the ``portal`` queue; deliveries on ``webhooks``.

Tasks take ids, never model instances; the clock is read here and passed down.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from notifications.services import (
    DELIVER_TASK,
    HANDLE_EVENT_TASK,
    do_attempt_delivery,
    do_fan_out_job_event,
    do_sweep_queued_long,
    due_delivery_ids,
    enqueue_delivery,
)

log = logging.getLogger(__name__)
SWEEP_TASK = "notifications.sweep"


@shared_task(name=HANDLE_EVENT_TASK, ignore_result=True)
def handle_job_event(job_event_id: int) -> list[int]:
    """Make the deliveries of one job event (their ``deliver`` tasks follow on commit)."""
    return do_fan_out_job_event(job_event_id=int(job_event_id), now=timezone.now())


ETA_MAX_S = 300.0
"""A retry further off than this is left to the sweep, not held by a worker as an ETA task:
an unacknowledged message comes back after the broker's visibility timeout
(``BROKER_VISIBILITY_TIMEOUT_SECONDS``), so a long ETA would be delivered in copies."""


@shared_task(name=DELIVER_TASK, ignore_result=True)
def deliver(delivery_id: int) -> str:
    """Try one delivery once; a failure schedules the next try (the sweep is the safety net).

    Runs on the ``webhooks`` queue's own worker (``CELERY_TASK_ROUTES``).
    """
    now = timezone.now()
    result = do_attempt_delivery(delivery_id=int(delivery_id), now=now)
    if result is None:
        return "skipped"
    due = result.next_attempt_at
    if due is not None and (due - now).total_seconds() <= ETA_MAX_S:
        enqueue_delivery(int(delivery_id), eta=due)
    return str(result.state)


@shared_task(name=SWEEP_TASK, ignore_result=True)
def sweep() -> dict[str, int]:
    """Beat, every 60 s: queued-too-long notices, and deliveries whose task was lost."""
    now = timezone.now()
    created = do_sweep_queued_long(now=now)
    due = due_delivery_ids(now=now)
    for delivery_id in due:
        enqueue_delivery(delivery_id)
    if created or due:
        log.info("notifications sweep: %d queued-long, %d due again", len(created), len(due))
    return {"queued_long": len(created), "requeued": len(due)}
