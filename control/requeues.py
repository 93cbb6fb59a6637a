"""Requeueing a job that does not run, a bounded number of times without progress.

Two paths put a placed job back in the queue without blaming its program
(no restart is counted): reconcile, when no agent runs any of its processes
(``control.reconcile``), and an agent's refusal to start it
(``control.rejections``).  Either may repeat for ever — a program that
exits at once, a slot some other process never lets go — so each requeue
leaves a note marked with the step the job would resume from, and once
``RECONCILE_MAX_REQUEUES`` of them sit at that same step, the job fails
instead, with the reason::

    requeue(J, why) ── notes at J's resume step < limit ─▶ note; queued (GPUs released)
                    └─ otherwise ──────────────────────▶ failed: "why; requeued N times ..."
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from django.conf import settings

from control.endings import fail_job
from jobs import holdings
from jobs.choices import EventKind, JobState
from jobs.lifecycle import broadcast, record, transition
from jobs.models import Job
from jobs.outbox import Outbox

REQUEUE_MARK = "reconcile_requeue"
"""Key of the note recorded with each such requeue: its value is the step it resumes from."""


def max_requeues() -> int:
    """How many requeues without progress a job gets (``RECONCILE_MAX_REQUEUES``)."""
    return int(settings.RECONCILE_MAX_REQUEUES)


def requeue_or_fail(
    job: Job, why: str, resume: str, now: datetime, *, stop: bool, spare: Collection[int] = ()
) -> str:
    """Requeue ``job`` (its step already rewound: ``resume`` says to what), or fail it.

    ``stop``: some of its workers may run (they are sent a stop, but for the
    GPUs of ``spare``, where none runs); otherwise nothing runs and the GPUs
    are only released.  Returns ``requeued`` or ``failed``.
    """
    limit = max_requeues()
    tries = job.events.filter(kind=EventKind.NOTE, **{f"data__{REQUEUE_MARK}": job.step}).count()
    if tries >= limit:
        fail_job(
            job,
            f"{why}; requeued {tries} times already without progress past step "
            f"{job.step}: the program never keeps running here",
            now,
        )
        return "failed"
    outbox = Outbox()
    released = holdings.release(job)
    if stop:
        outbox.stop_workers(job, [g for g in released if g not in spare], reason="requeued")
    record(
        job,
        EventKind.NOTE,
        now,
        reason=f"requeue {tries + 1} of at most {limit} without progress past step {job.step}",
        data={REQUEUE_MARK: job.step},
    )
    transition(job, JobState.QUEUED, at=now, reason=f"{why}: requeued, {resume}")
    outbox.send_on_commit()
    broadcast(job, "job.updated")
    return "requeued"
