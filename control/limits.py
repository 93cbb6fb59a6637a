"""Run-time limits: a job that has run for its ``max_runtime_s`` is stopped and fails.

The limit is wall clock since the job first started (``started_at``): time
queued after a preemption, a lost server or a retry counts too, so a job's
bill has a known end.  A tick step, before the policy runs (the GPUs it
frees are placed in the same tick)::

    running/scaling job (or one queued again since), started_at + max_runtime_s <= now
      └─ StopJob to its nodes (after commit; a queued job has none): the runtime stops every worker at an
         agreed mini-batch after a last checkpoint (forced: the CHECKPOINT_MIN_SECONDS
         floor of periodic ones does not apply); a torchrun program gets SIGTERM and
         its grace period to write its own
      └─ GPUs released, service accounted, failed: "run-time limit reached"

A session (``kind: session``) ends ``cancelled`` with "lifetime N s reached": its
lifetime is the end it was started with, not a failure.  Any other job ends ``failed`` at once, as a cancel ends ``cancelled``: its last
checkpoint arrives afterwards (an ``artifact_stored`` report, recorded for
any job) and later reports of the stopping run find a terminal job, so the
retry rule (``control.endings.fail_or_retry``) never requeues it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from control.endings import accrue_service
from jobs import holdings
from jobs.choices import ACTIVE_STATES, JobState
from jobs.lifecycle import broadcast, transition
from jobs.models import Job
from jobs.outbox import Outbox

RUNTIME_LIMIT_REASON = "run-time limit reached"
STOP_REASON = f"{RUNTIME_LIMIT_REASON}: final checkpoint, then stop"
#: The limit's clock runs from the first start on: a job queued again (preempted,
#: requeued, retried) is past its limit there too, and ends without starting again.
LIMITED_STATES = ACTIVE_STATES | {JobState.QUEUED}


def limit_reached(started_at: datetime | None, max_runtime_s: int | None, now: datetime) -> bool:
    """Whether a job first started at ``started_at`` has used up ``max_runtime_s`` by ``now``."""
    if started_at is None or max_runtime_s is None:
        return False
    return now - started_at >= timedelta(seconds=max_runtime_s)


def lifetime_reason(job: Job) -> str:
    """The final event's reason of a session that reached its maximum lifetime."""
    return f"lifetime {job.max_runtime_s} s reached"


def stop_jobs_at_limit(
    now: datetime, outbox: Outbox, deadlines: Mapping[int, datetime] | None = None
) -> list[int]:
    """Stop (gracefully) and fail every running job past its run-time limit; return their ids.

    Runs inside the tick's transaction; the stop commands go out with the
    tick's other commands once it commits.  ``deadlines`` (the kept state's:
    first start + limit of every queued, running or scaling job that has a
    limit) saves reading every such job to find the few that are due.
    """
    limited = LIMITED_STATES
    if deadlines is not None:
        due = [pk for pk, deadline in deadlines.items() if now >= deadline]
    else:
        rows = Job.objects.filter(
            state__in=limited, max_runtime_s__isnull=False, started_at__isnull=False
        ).values_list("pk", "started_at", "max_runtime_s")
        due = [pk for pk, started_at, limit in rows if limit_reached(started_at, limit, now)]
    if not due:
        return []
    stopped: list[int] = []
    for job in Job.objects.select_for_update().filter(pk__in=due):
        if job.state not in limited:
            continue
        accrue_service(job, now)  # saved with the transition below
        outbox.stop_workers(job, holdings.release(job), reason=STOP_REASON)
        if job.is_session:
            # A session's lifetime is the end it was started with, not a failure: no
            # failure reason, no failure notification, its home synced as at any stop.
            transition(job, JobState.CANCELLED, at=now, reason=lifetime_reason(job))
        else:
            job.failure_reason = RUNTIME_LIMIT_REASON
            ran = (now - job.started_at).total_seconds() if job.started_at else 0.0
            transition(
                job,
                JobState.FAILED,
                at=now,
                reason=f"failed: {RUNTIME_LIMIT_REASON} ({job.max_runtime_s} s since its "
                f"first start, {ran:.0f} s ago): stopped after a final checkpoint",
            )
        broadcast(job, "job.updated")
        stopped.append(job.pk)
    return stopped
