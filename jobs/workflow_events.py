"""Where a job's end reaches the jobs that wait for it and its array's waiting tasks.

Every end of a job — completed or failed by a report, stopped by the tick at
its run-time limit, cancelled by a person, a token or an admin, cancelled
because its own dependencies failed — is a ``JobEvent`` whose ``to_state`` is
terminal, written by ``jobs.lifecycle`` (one by one, or in bulk by
``Batch.flush``, which sends ``post_save`` for each).  :func:`job_event_saved`
listens to those and calls ``jobs.dependencies.on_job_ended`` in the same
transaction, so a release commits (or rolls back) with the end that caused it; the
end of a sweep trial's job reaches its sweep the same way (``jobs.sweeps``).
"""

from __future__ import annotations

from typing import Any

from jobs.choices import TERMINAL_STATES
from jobs.dependencies import on_job_ended
from jobs.models import JobEvent
from jobs.sweeps import on_trial_job_ended


def job_event_saved(sender: type[JobEvent], instance: JobEvent, created: bool, **_: Any) -> None:
    """A new event that ends its job: release or cancel what waited for it; a trial's job:
    its sweep records the result and moves on."""
    if not created or instance.to_state not in TERMINAL_STATES:
        return
    job = instance.job  # the object the lifecycle just moved: no query
    on_job_ended(job_id=job.pk, array_id=job.array_id, at=instance.at)
    on_trial_job_ended(job=job, at=instance.at)
