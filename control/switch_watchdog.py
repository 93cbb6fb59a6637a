"""A switch that never ends: a job stuck in ``scaling`` is stopped and requeued.

A stop-free resize, a migration and torchrun's stop-and-restart move a job to
``scaling``; the runtime's ``scale_done`` report (a torchrun run's ``started``)
moves it back to ``running``. Should that report never come (a joiner that
never started, a runtime that died mid-switch, a report lost), the job would
stay ``scaling`` for ever, holding its GPUs: the policy leaves a switching job
alone (its size is the runtime's for now) and reconcile judges only running
jobs. A tick step::

    scaling job J (the snapshot's ``switching``: each since its latest state event, which
    the tick's kept state reads once per change of the job, not on every tick)
      since + SCALING_TIMEOUT_SECONDS <= now
        └─ StopJob to its nodes (after commit), as a preemption: last checkpoint, then stop
        └─ GPUs released, service accounted, queued: it resumes from its latest checkpoint

A ``scale_done`` that arrives after all finds the job queued and changes
nothing. The step itself reads nothing unless a switch is overdue.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from django.conf import settings

from control.endings import accrue_service
from jobs import holdings
from jobs.choices import JobState
from jobs.lifecycle import broadcast, transition
from jobs.models import Job
from jobs.outbox import Outbox

STUCK_REASON = "switch not confirmed"


def overdue_switches(since: Mapping[int, datetime], now: datetime, timeout_s: float) -> list[int]:
    """The jobs in ``scaling`` since longer than ``timeout_s`` at ``now``, by id (pure)."""
    limit = timedelta(seconds=timeout_s)
    return sorted(job for job, at in since.items() if now - at >= limit)


def stop_stuck_switches(
    switching: Mapping[int, datetime],
    now: datetime,
    outbox: Outbox,
    timeout_s: float | None = None,
) -> list[int]:
    """Stop and requeue every job of ``switching`` (id: in ``scaling`` since) whose switch
    outlived the timeout; their ids.

    Runs inside the tick's transaction; the stop commands go out with the tick's
    other commands once it commits.
    """
    timeout = settings.SCALING_TIMEOUT_SECONDS if timeout_s is None else timeout_s
    due = overdue_switches(switching, now, timeout)
    if not due:
        return []
    stopped: list[int] = []
    for job in Job.objects.select_for_update().filter(pk__in=due, state=JobState.SCALING):
        accrue_service(job, now)  # saved with the transition below
        held = holdings.release(job)
        why = f"{STUCK_REASON} within {timeout:g} s"
        outbox.stop_workers(job, held, reason=f"{why}: checkpoint, then stop")
        transition(
            job,
            JobState.QUEUED,
            at=now,
            reason=f"{why}: its workers were stopped and it was requeued; it resumes from "
            "its latest checkpoint",
        )
        broadcast(job, "job.updated")
        stopped.append(job.pk)
    return stopped
