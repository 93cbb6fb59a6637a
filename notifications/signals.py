"""The trigger: a job event that may notify enqueues one task, after its transaction commits.

Connected in ``NotificationsConfig.ready`` to ``post_save`` of ``jobs.models.JobEvent``
(every event is written by ``jobs.lifecycle.record``). Nothing here touches the
network or looks up subscriptions: the tick and the pages that record events
wait for nothing but a broker message after commit.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from django.db import transaction

from jobs.models import JobEvent
from notifications.events import classify
from notifications.services import enqueue_job_event


def job_event_saved(
    sender: type[JobEvent], instance: JobEvent, created: bool, raw: bool = False, **kwargs: Any
) -> None:
    """``post_save`` receiver: a new event that may notify enqueues its fan-out on commit."""
    if not created or raw:
        return
    if classify(kind=instance.kind, to_state=instance.to_state, reason=instance.reason) is None:
        return
    transaction.on_commit(partial(enqueue_job_event, instance.pk))
