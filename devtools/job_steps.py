"""Moving a job along its lifecycle in tests, through the door production uses.

``move`` is what the control plane does when it changes a job's state: lock
the row, ``jobs.lifecycle.transition``, broadcast after commit.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from jobs import lifecycle
from jobs.models import Job


def move(
    *,
    job_id: int,
    to_state: str,
    reason: str,
    at: datetime | None = None,
    parallelism: int | None = None,
) -> Job:
    """Transition job ``job_id`` to ``to_state`` as the control plane would; return it."""
    with transaction.atomic():
        job: Job = Job.objects.select_for_update().get(pk=job_id)
        lifecycle.transition(
            job, to_state, reason=reason, at=at or timezone.now(), parallelism=parallelism
        )
        lifecycle.broadcast(job, "job.updated")
    return job
